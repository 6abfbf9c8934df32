"""Plans, searches, records and analyses batch-size sweeps."""

import worker as _worker  # noqa: F401  (pins a local Ray cluster to loopback before ray is imported)
