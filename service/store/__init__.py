"""The store of sweeps (each with its owner), browser sessions and sign-in links (SQLAlchemy) and its migrations
(Alembic). Owners themselves are configured (`SWEEPS_TOKENS`), not stored."""
