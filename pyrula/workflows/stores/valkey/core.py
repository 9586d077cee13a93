"""What every ValkeyStore operation shares: shard calls, hints, follow-ups, flow control.

A shard function returns ``{payload, workflow_hints, timer_hint, followups}``. On a single
node the hints were already written by the function itself (it may touch any key); on a
cluster they live in other slots, so :meth:`ValkeyCore._after` writes them here, each
guarded by the shard's version counter so a late write never undoes a newer one. A
process dying between the two leaves a stale hint, which the periodic resync repairs.
Follow-ups are the few effects that may cross shards (a child run on another shard, a
concurrency slot in the flow slot) and are applied here, in order.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from pyrula.workflows.errors import ConfigurationError, InvalidRunState, RunNotFound, StoreError
from pyrula.workflows.records import Lease, RunRecord
from pyrula.workflows.stores.flow import CLAIM_SHARE, Bucket
from pyrula.workflows.stores.notify import Notifier
from pyrula.workflows.stores.valkey.codec import num, text, to_run
from pyrula.workflows.stores.valkey.connection import Call, Server
from pyrula.workflows.stores.valkey.keys import Keys

log = logging.getLogger(__name__)

NEWS_TTL = 300
"""Seconds a worker's lease news waits for it (a worker that is gone never reads it)."""

EXPIRED_SINK: ContextVar[list[RunRecord] | None] = ContextVar("pyrula_valkey_expired", default=None)
"""Where the follow-ups of a claim put the runs it ended expired (``claim_runs`` sets it
for its own calls: ``Claimed.expired``); None outside a claim."""


def flat_text(value: Any) -> Any:
    """A reply with every bytes value decoded (lists recursively)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [flat_text(item) for item in value]
    return value


def parse_bucket(stored: str) -> Bucket | None:
    if not stored:
        return None
    tokens, updated = stored.split("|")
    return Bucket(float(tokens), float(updated))


@dataclass(frozen=True)
class HeldShards:
    """What a worker's last shard lease tick gave it (shards.py), and until when it may
    count on it: this process's monotonic clock, which runs on while the process is
    stopped."""

    shards: frozenset[int]
    args: tuple[str, ...]
    """The shards as ``claim_due`` takes them, formatted once per tick."""
    until: float


NONE_HELD = HeldShards(frozenset(), (), math.inf)


class ValkeyCore:
    """State and plumbing shared by the operation mixins of ValkeyStore."""

    url: str
    namespace: str
    shard_count: int
    cluster: bool
    _keys: Keys
    _server: Server
    _clock: Callable[[], float] | None
    _notifier: Notifier
    _known_workflows: dict[str, int]
    _opened: tuple[int, int] | None
    """(pid, server generation) of the open that checked the server, else None."""
    _held: dict[str, HeldShards]

    async def _ensure_open(self) -> None:
        raise NotImplementedError  # ValkeyStore

    async def cancel_run(self, run_id: str) -> RunRecord:
        raise NotImplementedError  # RunOps

    def held_shards(self, worker_id: str) -> HeldShards:
        raise NotImplementedError  # ShardLeases

    async def terminate_run(self, run_id: str) -> RunRecord:
        raise NotImplementedError  # RunOps

    # -- time --------------------------------------------------------------------------
    def _clock_arg(self) -> str:
        return "" if self._clock is None else num(self._clock())

    async def now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return server_time(await self._server.command("TIME"))

    @property
    def _inline(self) -> str:
        """ARGV[2] of shard functions: write hints inline unless on a cluster."""
        return "" if self.cluster else self.namespace

    # -- shard calls -------------------------------------------------------------------
    def _shard_call(self, name: str, shard: int, *args: Any) -> Call:
        return (name, self._keys.shard(shard), (self._inline, str(shard), *args))

    async def _shard(self, name: str, shard: int, *args: Any) -> Any:
        await self._ensure_open()
        reply = await self._server.call(*_spread(self._shard_call(name, shard, *args)))
        return await self._after(shard, reply)

    async def _run_call(self, name: str, run_id: str, *args: Any) -> Any:
        return await self._shard(name, self._keys.shard_of(run_id), *args)

    async def _shards(self, calls: Sequence[tuple[int, Call]]) -> list[Any]:
        """Several shard calls in one round trip; each payload or exception, in order."""
        await self._ensure_open()
        replies = await self._server.call_many([call for _, call in calls])
        out: list[Any] = []
        for (shard, _), reply in zip(calls, replies, strict=False):
            if isinstance(reply, BaseException):
                out.append(reply)
            else:
                out.append(await self._after(shard, reply))
        return out

    async def _after(self, shard: int, reply: Any) -> Any:
        payload, hints, timer_hint, followups = reply
        if hints or timer_hint:
            await self._apply_hints(shard, flat_text(hints), flat_text(timer_hint))
        if followups:
            await self._followups(flat_text(followups), payload)
        return payload

    async def _apply_hints(self, shard: int, hints: list[str], timer_hint: list[str]) -> None:
        by_workflow: dict[str, list[str]] = {}
        for i in range(0, len(hints), 5):
            wf, ver, due, timer, wake = hints[i : i + 5]
            by_workflow.setdefault(wf, []).extend([str(shard), str(ver), due, timer, wake])
        calls: list[Call] = [
            ("hint_set", self._keys.hint(wf), args) for wf, args in by_workflow.items()
        ]
        if timer_hint:
            ver, timer = timer_hint
            calls.append(("timer_hint_set", self._keys.timer_hint, (str(shard), str(ver), timer)))
        for result in await self._server.call_many(calls):
            if isinstance(result, BaseException):
                raise result

    async def _followups(self, flat: list[str], payload: Any) -> None:
        """Apply a call's follow-ups in order; idempotency keys to release go together, in
        one round trip per node at the end (a purge of 500 keyed runs: one, not 500)."""
        releases: list[Call] = []
        news: set[str] = set()
        for i in range(0, len(flat), 4):
            kind, a, b, c = flat[i : i + 4]
            if kind == "news":  # a worker whose run was cancelled or terminated
                news.add(a)
            elif kind == "flow_release":
                await self._flow_release(a, b, c)
            elif kind == "child_ended":
                await self._run_call("child_ended", a, a, b)
            elif kind == "add_kid":
                await self._server.command("SADD", self._keys.kids(a), b)
            elif kind == "drop_kid":
                await self._server.command("SREM", self._keys.kids(a), b)
            elif kind == "drop_key":
                shard = self._keys.shard(self._keys.shard_of_key(a))
                releases.append(("idem_release", shard, (a, b)))
            elif kind in ("cancel", "terminate"):
                with contextlib.suppress(InvalidRunState, RunNotFound):
                    if kind == "cancel":
                        await self.cancel_run(a)
                    else:
                        await self.terminate_run(a)
            elif kind == "expired":  # a claim ended a run past its expires_at
                sink = EXPIRED_SINK.get()
                if sink is not None:
                    sink.append(to_run(a, b))
            elif kind == "flow_renew":  # renew's payload is {states, expires_at}
                expires = text(payload[1])
                key = self._keys.concurrency(a, b)
                await self._server.command("ZADD", key, "XX", expires, c)
        for result in await self._server.call_many(releases):
            if isinstance(result, BaseException):
                raise result
        for worker_id in sorted(news):
            await self._tell(worker_id)

    async def _tell(self, worker_id: str) -> None:
        """Lease news for ``worker_id`` (``wait_lease_news``): the change is made, so a
        failure here only leaves the worker to learn at its next renewal."""
        key = self._keys.lease_news(worker_id)
        try:
            await self._server.command("LPUSH", key, "1")
            await self._server.command("EXPIRE", key, str(NEWS_TTL))
        except StoreError as exc:
            log.warning("could not tell worker %s of a cancel or terminate: %s", worker_id, exc)

    # -- flow control ------------------------------------------------------------------
    async def _flow_release(self, workflow: str, owner: str, run_id: str) -> None:
        """Free a run's concurrency slot and wake claimers of its workflow."""
        await self._server.command("ZREM", self._keys.concurrency(workflow, owner), run_id)
        wake = self._keys.wake(workflow)
        await self._server.command("LPUSH", wake, "1")
        await self._server.command("LTRIM", wake, 0, 7)

    async def _flow_take(self, run: list[str], workflow: str, lease_ttl: float) -> str:
        """'ok' (the run may be claimed: this call gave it its slot and token), or why it
        is held back ('cap', 'rate', 'held': another claimer took its slot)."""
        run_id, owner, rate_key, per_second, burst, cap = run
        reply = await self._server.call(
            "flow_take",
            self._keys.flow,
            self._keys.concurrency(workflow, owner) if cap else "",
            run_id,
            cap or "0",
            rate_key,
            per_second or "0",
            burst or "1",
            num(lease_ttl),
        )
        return text(reply[0])

    # -- workflows ---------------------------------------------------------------------
    async def _note_workflow(self, workflow: str) -> None:
        """Record the workflow's shard count on first use (a mismatch is refused)."""
        generation = self._server.generation
        if self._known_workflows.get(workflow) == generation:
            return
        recorded = await self._server.call(
            "meta_check", self._keys.meta, "w:" + workflow, str(self.shard_count)
        )
        count = int(text(recorded[0]))
        if count != self.shard_count:
            raise ConfigurationError(
                f"workflow {workflow!r} in Valkey namespace {self.namespace!r} at "
                f"{self._server.masked} uses shard_count={count}, this store "
                f"shard_count={self.shard_count}: use the same count on every worker "
                "(changing it means draining the workflow first)"
            )
        client = self._server.client()
        try:
            await self._server.write_markers(client, [self._keys.hint_marker(workflow)])
        except Exception as exc:
            raise self._server.translate(exc) from None
        self._known_workflows[workflow] = generation


def _spread(call: Call) -> tuple[Any, ...]:
    name, key, args = call
    return (name, key, *args)


def lease_of(run_id: str, flat: Any) -> Lease:
    run = to_run(run_id, flat_text(flat))
    assert run.lease_expires_at is not None
    return Lease(run=run, token=run.lease_token, expires_at=run.lease_expires_at)


def server_time(reply: Any) -> float:
    """A ``TIME`` reply (seconds, microseconds; as text or numbers) as epoch seconds."""
    seconds, micros = reply
    return int(seconds) + int(micros) / 1_000_000


def rotate(items: list[int], by: int) -> list[int]:
    if not items:
        return items
    by %= len(items)
    return items[by:] + items[:by]


def quota(remaining: int, shards: int) -> int:
    """What a claim asks of each of ``shards`` open shards (claim_due.lua's claim_due too)."""
    return min(remaining, max(CLAIM_SHARE, math.ceil(remaining / max(1, shards))))


def monotonic() -> float:
    return time.monotonic()
