"""The JSON API: its routes, auth and browser sessions, limits, errors, middleware, health and metrics."""
