"""Alembic environment of the service store.

From code (`service.store.migrations.upgrade`) the connection arrives in `config.attributes`; from the
command line the URL is `sqlalchemy.url`, else the service's own settings (SWEEPS_DATABASE_URL).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from service.store.database import Base, make_engine

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return url
    from service.settings import Settings

    settings = Settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)  # the default SQLite store lives there
    return settings.database


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
