"""What several archive tests share: an ArchivingStore(Valkey, Postgres) on a fake clock
whose archive counts its lookups (the ``store`` and ``clock`` fixtures, offered by
conftest.py), and a run
taken through its whole life to the archive."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from pyrula.workflows import ArchivingStore, PostgresArchive
from pyrula.workflows.records import NewRun, Outcome, RunRecord
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.stores.conftest import FakeClock
from tests.stores.helpers import COMPLETED
from tests.valkey.servers import ValkeyProcess, fresh_namespace

TTL = 10.0
SKEW = 1.0


class CountingArchive(PostgresArchive):
    """A PostgresArchive that counts its ``get_run`` lookups, and can be told to miss the
    next ones (as if the run were archived just after the lookup)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.lookups = 0
        self.misses = 0

    async def get_run(self, run_id: str) -> RunRecord | None:
        self.lookups += 1
        if self.misses > 0:
            self.misses -= 1
            return None
        return await super().get_run(run_id)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(
    valkey_server: ValkeyProcess, archive_dsn: str, clock: FakeClock
) -> AsyncIterator[ArchivingStore]:
    live = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=2, clock=clock)
    built = ArchivingStore(live, CountingArchive(archive_dsn), TTL, clock_skew=SKEW)
    await built.open()
    try:
        yield built
    finally:
        await built.close()


def counting(store: ArchivingStore) -> CountingArchive:
    assert isinstance(store.archive, CountingArchive)
    return store.archive


async def ended_and_archived(
    store: ArchivingStore, clock: FakeClock, new: NewRun, outcome: Outcome = COMPLETED
) -> RunRecord:
    """Create ``new``, run it to its end (``outcome``), archive it and expire it from
    Valkey (the reconcile loop's two steps, forced); the archived record."""
    _, created = await store.create_run(new)
    assert created
    (lease,) = await store.claim_runs("w1", [new.workflow], 1, 30.0)
    assert lease.run_id == new.run_id
    await store.finish_run(new.run_id, lease.token, outcome)
    clock.advance(SKEW + 1)
    assert await store.archive_ended() == 1
    clock.advance(TTL + 1)
    assert await store.expire_archived() == 1
    assert await store.live.get_run(new.run_id) is None
    archived = await store.archive.get_run(new.run_id)
    assert archived is not None and archived.status is outcome.status
    return archived
