"""ValkeyStore: the production store on a Valkey server or cluster (see store.py)."""

from pyrula.workflows.stores.valkey.store import ValkeyStore

__all__ = ["ValkeyStore"]
