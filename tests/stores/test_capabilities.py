"""The declared seam: parts a feature asks for, and optional capabilities found with
``isinstance``, through a wrapping store too."""

from __future__ import annotations

import pytest

from pyrula.workflows.errors import ConfigurationError
from pyrula.workflows.stores.base import (
    CompleteStore,
    LeaseNews,
    Store,
    events_of,
    fast_path_of,
    history_of,
    lease_news_of,
    native_purge_of,
    reconciling_of,
    shard_leasing_of,
    signals_of,
)
from pyrula.workflows.stores.memory import MemoryStore


class CoreOnly:
    """The core protocol and nothing else: every call goes to a MemoryStore, the parts'
    operations are left out."""

    PARTS = frozenset(
        {
            "send_signal",
            "consume_signal",
            "delete_run",
            "purge_runs",
            "ended_runs",
            "append_events",
            "read_events",
            "consume_events",
            "get_cursor",
            "swap_cursor",
            "wait_lease_news",
        }
    )

    def __init__(self) -> None:
        self._inner = MemoryStore()
        self.url = "core-only://"
        for name in dir(self._inner):
            if not name.startswith("_") and name not in self.PARTS and name != "url":
                setattr(self, name, getattr(self._inner, name))


class Wrapper:
    """A store over another one (``Wrapping``) that has no capability of its own."""

    def __init__(self, live: Store) -> None:
        self._live = live

    @property
    def live(self) -> Store:
        return self._live


def test_a_core_only_store_is_a_store_and_is_refused_by_the_features_that_need_a_part() -> None:
    store = CoreOnly()
    assert isinstance(store, Store)
    assert not isinstance(store, CompleteStore)
    with pytest.raises(ConfigurationError, match="no SignalStore, which sending a signal needs"):
        signals_of(store, "sending a signal")
    with pytest.raises(ConfigurationError, match="no RunHistory, which run_retention needs"):
        history_of(store, "run_retention")
    with pytest.raises(ConfigurationError, match="no EventStore, which projections needs"):
        events_of(store, "projections")
    assert lease_news_of(store) is None  # the worker renews at its interval instead


def test_every_bundled_part_is_found_on_a_memory_store() -> None:
    store = MemoryStore()
    assert isinstance(store, CompleteStore)
    assert signals_of(store, "x") is store
    assert history_of(store, "x") is store
    assert events_of(store, "x") is store
    assert lease_news_of(store) is store
    for lookup in (shard_leasing_of, reconciling_of, native_purge_of, fast_path_of):
        assert lookup(store) is None, lookup


def test_a_wrapper_offers_the_capabilities_of_the_store_it_wraps() -> None:
    inner = MemoryStore()
    outer = Wrapper(Wrapper(inner))  # recursively
    found = lease_news_of(outer)
    assert found is inner and isinstance(found, LeaseNews)
    assert native_purge_of(outer) is None
    assert lease_news_of(Wrapper(CoreOnly())) is None


def test_an_archiving_store_refuses_a_live_store_without_every_part() -> None:
    from pyrula.workflows.stores.archive import ArchivingStore, PostgresArchive

    archive = PostgresArchive("postgresql://127.0.0.1:1/never")  # connects on first use
    with pytest.raises(ConfigurationError, match="core-only:// lacks some"):
        ArchivingStore(CoreOnly(), archive)
