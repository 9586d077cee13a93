"""Fixtures of the Valkey suite: real servers (see servers.py) and stores on them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.conftest import FakeClock
from tests.valkey.servers import (  # noqa: F401  (fixtures)
    ValkeyClusterProcesses,
    ValkeyProcess,
    fresh_namespace,
    valkey_cluster,
    valkey_server,
)

MakeStore = Callable[..., Awaitable[ValkeyStore]]


@pytest.fixture
def clock() -> FakeClock:
    """A store clock that moves only when told (passed to ValkeyStore(clock=...))."""
    return FakeClock()


@pytest.fixture(params=["single", "cluster"])
def topology(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[MakeStore]:
    """``await make_store(topology="single", **kwargs)``: an opened ValkeyStore in a fresh
    namespace (unless one is given); closed at teardown."""
    built: list[ValkeyStore] = []

    async def make(topology: str = "single", **kwargs: Any) -> ValkeyStore:
        if topology == "cluster":
            url = request.getfixturevalue("valkey_cluster").url
            kwargs.setdefault("cluster", True)
        else:
            url = request.getfixturevalue("valkey_server").url
        kwargs.setdefault("namespace", fresh_namespace())
        store = ValkeyStore(url, **kwargs)
        built.append(store)
        await store.open()
        return store

    try:
        yield make
    finally:
        for store in reversed(built):
            await store.close()


@pytest.fixture
def own_server() -> Iterator[ValkeyProcess]:
    """A single node of the test's own, for what is server-wide or disruptive (pausing it,
    pruning libraries, ACL users, the tombstone); stopped by its PID afterwards."""
    server = ValkeyProcess()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def function_calls(store: ValkeyStore, prefix: str = "") -> list[str]:
    """The names of the library functions ``store`` calls from now on (starting with
    ``prefix``), in order; the calls still run."""
    names: list[str] = []
    server = store._server
    call = server.call

    async def recording(name: str, key: str, *args: Any) -> Any:
        if name.startswith(prefix):
            names.append(name)
        return await call(name, key, *args)

    server.call = recording  # type: ignore[method-assign]
    return names
