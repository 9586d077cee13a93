"""MemoryStore: the in-process store and executable specification."""

from pyrula.workflows.stores.memory.store import MemoryStore

__all__ = ["MemoryStore"]
