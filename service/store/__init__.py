"""The store of sweeps, owners and sessions (SQLAlchemy) and its migrations (Alembic)."""
