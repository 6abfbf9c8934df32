"""The HTTP API and its browser pages: the app, its routes, auth and sessions, limits, metrics."""
