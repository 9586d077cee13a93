"""Shard leases: how the workers of one namespace spread its shards among themselves.

A worker leases unowned shards for ``shard_lease_ttl`` seconds and renews them every
``shard_lease_interval``; each tick also rebalances toward ``ceil(shard_count / N)``
shards per live worker (a worker holding more gives the extra back for newcomers). A
worker claims from its own shards first and then from any, so a lease spreads the load
but fences nothing: the per-run claim lock (its fenced token) stops double runs. A clean
stop releases the leases at once; a crashed worker's lapse after the TTL.

What a tick gave a worker counts as its own only until that lease may have lapsed: ``ttl``
seconds after the tick was sent (the server's lease runs from when it ran the tick, no
earlier). A worker that could not renew in time (stopped, its event loop blocked, the
server unreachable) then claims as if it held no shard, never preferring shards that may
be another's by now, until a tick says what it holds.

The worker drives this through two optional store methods it looks for:
``shard_lease_loop(worker_id, interval)`` (a task it runs beside its other loops and
cancels at shutdown, which releases the leases) and ``release_shards(worker_id)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from time import monotonic

from pyrula.workflows.errors import StoreError
from pyrula.workflows.stores.valkey.codec import num
from pyrula.workflows.stores.valkey.core import NONE_HELD, HeldShards, ValkeyCore

log = logging.getLogger(__name__)


class ShardLeases(ValkeyCore):
    shard_lease_ttl: float
    shard_lease_interval: float

    def held_shards(self, worker_id: str) -> HeldShards:
        """The shards ``worker_id`` held at its last lease tick in this process, while
        that tick's leases last (none once they may have lapsed)."""
        held = self._held.get(worker_id, NONE_HELD)
        return held if monotonic() < held.until else NONE_HELD

    def owned_shards(self, worker_id: str) -> frozenset[int]:
        return self.held_shards(worker_id).shards

    async def lease_shards(self, worker_id: str) -> frozenset[int]:
        """One lease tick: renew, rebalance, take free shards. Returns what it holds."""
        await self._ensure_open()
        sent = monotonic()
        held = await self._server.call(
            "lease_tick",
            self._keys.leases,
            worker_id,
            num(self.shard_lease_ttl),
            str(self.shard_count),
        )
        owned = frozenset(int(shard) for shard in held)
        args = tuple(str(shard) for shard in sorted(owned))
        self._held[worker_id] = HeldShards(owned, args, sent + self.shard_lease_ttl)
        return owned

    async def release_shards(self, worker_id: str) -> None:
        """Give back every shard ``worker_id`` holds, at once (clean stop)."""
        self._held.pop(worker_id, None)
        await self._ensure_open()
        released = await self._server.call("lease_release", self._keys.leases, worker_id)
        if int(released):
            log.info("worker %s released %d shard leases", worker_id, int(released))

    async def shard_lease_loop(self, worker_id: str, interval: float | None = None) -> None:
        """Hold shard leases for ``worker_id`` until cancelled, then release them.

        Renewals come every ``interval`` (the worker's ``shard_lease_interval``) or this
        store's own ``shard_lease_interval``, whichever is shorter: either may have been
        lowered (the worker refuses an interval not shorter than ``shard_lease_ttl``).
        """
        every = self.shard_lease_interval
        if interval is not None and 0 < interval < every:
            every = interval
        try:
            while True:
                try:
                    await self.lease_shards(worker_id)
                except StoreError as exc:
                    log.warning("shard lease renewal failed: %s", exc)
                await asyncio.sleep(every)
        finally:
            with contextlib.suppress(StoreError, asyncio.CancelledError):
                await asyncio.shield(self.release_shards(worker_id))

    async def shard_holders(self) -> dict[int, str]:
        """Which worker holds each leased shard (expired leases included)."""
        await self._ensure_open()
        flat = await self._server.command("HGETALL", self._keys.lease_holders)
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=False)
        out: dict[int, str] = {}
        for shard, value in items:
            raw = value.decode() if isinstance(value, bytes) else str(value)
            out[int(shard)] = raw.rsplit("|", 1)[0]
        return out
