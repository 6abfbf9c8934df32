"""The HTTP surface of batch-size sweeps and the store of sweeps (never imports torch)."""

import worker as _worker  # noqa: F401  (pins a local Ray cluster to loopback before ray is imported)
