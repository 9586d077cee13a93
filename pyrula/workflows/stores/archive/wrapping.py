"""A store over the Postgres archive, built the same way in every process that uses it.

``pyrula worker --postgres-dsn DSN`` (env ``PYRULA_POSTGRES_DSN``) and the Celery
drop-in's clients (:func:`pyrula_compat.store.client_for`, which reads the same variable)
both wrap their store with :func:`with_archive`, so a web process reads an archived run
and keeps its id taken exactly as the workers' store does.

Wrapping archives nothing by itself: copying ended runs to the archive and expiring them
from the live store is the reconcile loop, which only a
:class:`~pyrula.workflows.worker.WorkflowWorker` starts. A client's ArchivingStore reads
through to the archive and checks chosen run ids against it, nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pyrula.workflows.stores.archive.archiving import ArchivingStore
from pyrula.workflows.stores.archive.postgres import PostgresArchive
from pyrula.workflows.stores.base import Store

POSTGRES_DSN_ENV = "PYRULA_POSTGRES_DSN"
"""The environment variable naming the Postgres archive (``pyrula worker --postgres-dsn``)."""


def postgres_dsn_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The archive's DSN from ``PYRULA_POSTGRES_DSN`` (in ``environ``, default
    ``os.environ``); None when it is unset or blank."""
    value = (os.environ if environ is None else environ).get(POSTGRES_DSN_ENV, "")
    return value.strip() or None


def with_archive(store: Store, dsn: str | None) -> Store:
    """``store`` as an :class:`ArchivingStore` over ``PostgresArchive(dsn)`` (default
    options), or ``store`` itself when ``dsn`` is None or blank.

    Raises ConfigurationError when psycopg is not installed. Nothing is connected here:
    the archive connects on first use (``open()`` checks its schema)."""
    if dsn is None or not dsn.strip():
        return store
    return ArchivingStore(store, PostgresArchive(dsn))


__all__ = ["POSTGRES_DSN_ENV", "postgres_dsn_from_env", "with_archive"]
