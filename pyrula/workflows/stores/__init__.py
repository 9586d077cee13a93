"""Stores, and ``open_store`` which picks one from a URL."""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.memory import MemoryStore

DEFAULT_STORE_URL = "sqlite:///pyrula.db"
"""Used when neither a URL, ``PYRULA_STORE_URL`` nor ``default=`` is given."""


def open_store(url: str | None = None, *, default: str | None = None) -> Store:
    """A store for ``url``.

    Precedence: an explicit ``url``, then the ``PYRULA_STORE_URL`` environment variable,
    then ``default``, then ``sqlite:///pyrula.db`` in the working directory.
    ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` open an embedded
    SQLite file; ``memory://`` an in-process store; ``redis://``, ``rediss://``,
    ``valkey://``, ``valkeys://`` and ``unix://`` a :class:`ValkeyStore` (its
    ``namespace``, ``shard_count`` and ``cluster`` may ride in the query string:
    ``redis://host:6379/0?namespace=staging&cluster=true``).
    """
    chosen = url or os.environ.get("PYRULA_STORE_URL") or default or DEFAULT_STORE_URL
    scheme = urlsplit(chosen).scheme.lower()
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        from pyrula.workflows.stores.sqlite import SqliteStore

        path = chosen[len("sqlite:///") :] if chosen.lower().startswith("sqlite:///") else ""
        if not path:
            raise ConfigurationError(
                f"store URL {chosen!r} names no file; use sqlite:///relative.db or "
                "sqlite:////absolute/path.db"
            )
        return SqliteStore(path)
    if scheme in {"redis", "rediss", "valkey", "valkeys", "unix"}:
        from pyrula.workflows.stores.valkey import ValkeyStore

        return ValkeyStore.from_url(chosen)
    raise ConfigurationError(
        f"unknown store URL {chosen!r}: expected redis://host:port (Valkey), "
        "sqlite:///path.db or memory://"
    )


__all__ = ["DEFAULT_STORE_URL", "MemoryStore", "Store", "open_store"]
