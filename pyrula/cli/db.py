"""``pyrula db``: the Postgres archive's schema.

``pyrula db migrate`` creates it (idempotent); ``pyrula db check`` says whether a
deployment is ready: the Valkey store opens (reachable, its function library loadable)
and the archive's schema is this pyrula version's. Both print one line and exit 0, or
print the error's message and exit 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pyrula.cli.render import CliError
from pyrula.workflows.errors import PyrulaError
from pyrula.workflows.stores.archive.postgres import PostgresArchive
from pyrula.workflows.stores.archive.postgres.sql import pyrula_version

F = TypeVar("F", bound=Callable[..., Any])

DSN_ENV = "PYRULA_POSTGRES_DSN"


def postgres_dsn_option(required: bool) -> Callable[[F], F]:
    """``--postgres-dsn DSN``, also read from ``PYRULA_POSTGRES_DSN``."""
    return click.option(
        "--postgres-dsn",
        "postgres_dsn",
        envvar=DSN_ENV,
        show_envvar=True,
        required=required,
        metavar="DSN",
        help="The Postgres archive: a libpq DSN or postgresql:// URI.",
    )


def _archive(dsn: str) -> PostgresArchive:
    try:
        return PostgresArchive(dsn)
    except PyrulaError as exc:
        raise CliError(str(exc)) from None


@click.group("db")
def db_group() -> None:
    """The Postgres archive: apply its schema, check a deployment."""


@db_group.command("migrate")
@postgres_dsn_option(required=True)
def migrate_command(postgres_dsn: str) -> None:
    """Create the archive's tables (idempotent). A schema another pyrula version
    migrated is refused: recreate the database and migrate again."""
    archive = _archive(postgres_dsn)

    async def go() -> None:
        try:
            await archive.migrate()
        finally:
            await archive.close()

    try:
        asyncio.run(go())
    except PyrulaError as exc:
        raise CliError(str(exc)) from None
    click.echo(f"OK: {archive.url} migrated (pyrula {pyrula_version()})")


@db_group.command("check")
@click.option(
    "--valkey-url",
    required=True,
    metavar="URL",
    help="The live Valkey store: redis://host:port (namespace etc. in the query string).",
)
@postgres_dsn_option(required=True)
def check_command(valkey_url: str, postgres_dsn: str) -> None:
    """Check that the Valkey store opens and the archive's schema is this version's."""
    from pyrula.workflows.stores.valkey import ValkeyStore

    archive = _archive(postgres_dsn)
    try:
        live = ValkeyStore.from_url(valkey_url)
    except PyrulaError as exc:
        raise CliError(str(exc)) from None

    async def go() -> None:
        try:
            await live.open()
            await archive.check()
        finally:
            await live.close()
            await archive.close()

    try:
        asyncio.run(go())
    except PyrulaError as exc:
        raise CliError(str(exc)) from None
    click.echo(f"OK: {live.url} and the archive at {archive.url} (pyrula {pyrula_version()})")
