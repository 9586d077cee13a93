"""ValkeyStore's schedule change marker: the ``...{ns:sched}:chg`` stream a schedule loop
blocks on with ``XREAD``, in slices, keeping its connection when it is cut short."""

from __future__ import annotations

import asyncio
import time

from pyrula.workflows.schedules import Schedule
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.valkey.conftest import MakeStore
from tests.valkey.servers import ValkeyProcess, fresh_namespace


async def test_a_wait_longer_than_a_block_slice_sees_a_change_in_a_later_slice(
    make_store: MakeStore, topology: str
) -> None:
    store = await make_store(topology, socket_timeout=0.4)
    assert store.block_slice == 0.2
    other = await make_store(topology, namespace=store.namespace)  # another client
    seen = await store.wait_schedule_change(None, 0)
    started = time.monotonic()
    waiting = asyncio.ensure_future(store.wait_schedule_change(seen, 10))
    await asyncio.sleep(0.7)  # several slices have timed out
    assert not waiting.done()
    await other.create_schedule(Schedule.create("wf", every=5).to_record(await other.now()))
    current = await asyncio.wait_for(waiting, timeout=5)
    assert current != seen and current == await other.wait_schedule_change(None, 0)
    assert time.monotonic() - started < 5
    stream = store._keys.sched + "chg"
    assert await store._server.command("XLEN", stream) == 1  # kept to one entry


async def test_a_cancelled_wait_keeps_its_connection(own_server: ValkeyProcess) -> None:
    store = ValkeyStore(own_server.url, namespace=fresh_namespace(), socket_timeout=0.4)
    await store.open()
    admin = own_server.client()
    try:
        seen = await store.wait_schedule_change(None, 0)
        await store.wait_schedule_change(seen, 0.3)  # the blocking connection exists
        opened = admin.info("stats")["total_connections_received"]
        for _ in range(3):
            waiting = asyncio.ensure_future(store.wait_schedule_change(seen, 5))
            await asyncio.sleep(0.05)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await asyncio.sleep(0.4)  # its XREAD times out (0.2 s slices) and is read
        assert await store.wait_schedule_change(seen, 0.3) == seen
        assert admin.info("stats")["total_connections_received"] == opened
    finally:
        await store.close()
        admin.close()
