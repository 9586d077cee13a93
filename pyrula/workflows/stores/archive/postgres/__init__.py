"""The Postgres archive (psycopg 3, an optional extra: ``pip install 'pyrula[postgres]'``)."""

from pyrula.workflows.stores.archive.postgres.store import PostgresArchive

__all__ = ["PostgresArchive"]
