"""Fixtures for the tests that drive the engine's loops by hand (triggers, projections):
``store``, a MemoryStore on ``clock``, a clock that moves only when told to. A module's
own ``store`` fixture takes precedence."""

from __future__ import annotations

import pytest

from pyrula.workflows import MemoryStore, Store
from tests.stores.conftest import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(clock: FakeClock) -> Store:
    built = MemoryStore(clock=clock)
    await built.open()
    return built
