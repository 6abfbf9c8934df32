"""Alembic, driven from code: `upgrade(engine)` brings a store's schema to the newest migration.

The same migrations run from the command line with service/store/alembic.ini:
`SWEEPS_DATABASE_URL=... alembic -c service/store/alembic.ini upgrade head`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

SCRIPT_LOCATION = Path(__file__).resolve().parent / "alembic"


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_LOCATION))
    if url is not None:
        # '%' is ConfigParser's interpolation character; URLs may hold it (escaped passwords)
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config()
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection  # env.py migrates on this connection
        command.upgrade(cfg, revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
