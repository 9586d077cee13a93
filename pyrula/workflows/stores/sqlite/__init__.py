"""The SQLite store: one WAL-mode database file shared by the processes of one machine."""

from pyrula.workflows.stores.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
