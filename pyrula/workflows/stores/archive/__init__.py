"""Archiving: ended runs copied from a live store to a durable archive (Postgres).

:class:`ArchivingStore` wraps a live store (Valkey) and an :class:`Archive`
(:class:`PostgresArchive`); see ``docs/archive.md``.
"""

from pyrula.workflows.stores.archive.archiving import ArchivingStore
from pyrula.workflows.stores.archive.base import Archive, ArchiveCursor
from pyrula.workflows.stores.archive.postgres import PostgresArchive

__all__ = ["Archive", "ArchiveCursor", "ArchivingStore", "PostgresArchive"]
