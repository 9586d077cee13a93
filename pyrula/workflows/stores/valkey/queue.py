"""ValkeyStore's worker side: claims across shards, leases, the journal, timers, recovery.

Claiming one workflow: read its hint (the shards with due work; this also clears its
wake-up list, since this claimer now looks at all of them), then claim on those shards in
one round trip, the worker's own leased shards first, rotating so that every shard is
visited in turn: a tenant with a few runs waits about one pass over the shards. On a
single node both steps are one call (``claim_due``), which may touch every shard; on a
cluster they are two, the second pipelined per node. On each
shard the Lua picks owners by deficit round robin (stores/flow.py). A run under flow
control stops the shard's claim; its rate token and concurrency slot are taken in the
flow slot, then the claim on that shard continues with the run admitted or its owner
skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.errors import RunNotFound, StoreError
from pyrula.workflows.records import (
    JournalEntry,
    Lease,
    Outcome,
    RecoveryReport,
    RunRecord,
    Wait,
)
from pyrula.workflows.stores.base import Claimed, RenewResult
from pyrula.workflows.stores.rules import check_finish_outcome, dead_letter_error
from pyrula.workflows.stores.valkey.clients import drop_reply
from pyrula.workflows.stores.valkey.codec import entry_args, num, text, to_entry, to_run
from pyrula.workflows.stores.valkey.core import (
    EXPIRED_SINK,
    ValkeyCore,
    flat_text,
    lease_of,
    monotonic,
    quota,
    rotate,
)
from pyrula.workflows.stores.valkey.finishing import FinishBatches
from pyrula.workflows.stores.valkey.runs import nondeterminism

log = logging.getLogger(__name__)

RESYNC_INTERVAL = 30.0
"""On a cluster, how often a claimer rewrites its workflow's hints from every shard."""

WAKE_READY = "r"
"""The value of a wake-up pushed for runs put on a ready list (lua/common.lua push_wake)."""

HINT_EVERY = 0.01
"""Single node: a claim that its workflow's ready list can fill reads the shards' queues
first at least this often (seconds), and for this long after it found the list dry; the
most a due run in a shard's queue (a delayed one, say) waits behind a long ready list."""

NEVER_READ = (0.0, 0.0)
"""A workflow's (shards first from, ready list dry until) before its first claim."""


class QueueOps(ValkeyCore):
    """Claims, leases, journal writes, timers and recovery."""

    block_slice: float
    _cursor: dict[str, int]
    _resynced: dict[str, float]
    _recover_from: int
    _shards_first: dict[str, tuple[float, float]]
    _wake_turn: int
    _finishes: FinishBatches
    _wake_waits: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Future[Any]]

    async def _block(self, closed: asyncio.Future[None], *command: Any) -> Any:
        raise NotImplementedError  # RunOps

    async def get_run(self, run_id: str) -> RunRecord | None:
        raise NotImplementedError  # RunOps

    # -- waiting for work --------------------------------------------------------------
    async def wait_for_work(self, workflows: Sequence[str], timeout: float) -> Sequence[str] | None:
        """Block on the workflows' wake-up lists. Returns the workflow whose wake-up
        ended the wait when it was pushed for runs put on its ready list
        (``WAKE_READY``: due now, under no flow control, so a claim that finds none of
        them lost them to another claimer), else None. On a single node ``BLPOP`` pops
        from the first non-empty list in the order given, rotated by one each call so
        that one workflow's stream of wake-ups cannot keep another's waiting; the
        others' wake-ups stay for the next wait."""
        names = list(dict.fromkeys(workflows))
        if not names or timeout <= 0 or self._notifier.closed:
            return None
        await self._ensure_open()
        closed = self._notifier.register("close")
        block = f"{max(0.01, min(timeout, self.block_slice)):.3f}"
        try:
            if not self.cluster or len(names) == 1:
                self._wake_turn = turn = (self._wake_turn + 1) % len(names)
                order = names[turn:] + names[:turn]
                keys = [self._keys.wake(wf) for wf in order]
                popped = await self._block(closed, "BLPOP", *keys, block)
                if not popped or text(popped[1]) != WAKE_READY:
                    return None
                return [order[keys.index(text(popped[0]))]]
            # One BLPOP per workflow (their keys are in different slots). The ones still
            # blocked when this call returns are kept for the next call, not cancelled:
            # a cancelled one would run on (parked) and take the next wake-up of its
            # workflow away from this very worker. One that returned meanwhile makes
            # the next call return at once.
            loop = asyncio.get_running_loop()
            waits = [self._wake_wait(loop, wf, block) for wf in names]
            await asyncio.wait([*waits, closed], return_when=asyncio.FIRST_COMPLETED)
            for wf in names:
                if self._wake_waits[loop, wf].done():
                    del self._wake_waits[loop, wf]
            return None  # a cluster has no ready lists: no wake-up is WAKE_READY
        finally:
            self._notifier.unregister("close", closed)

    def _wake_wait(
        self, loop: asyncio.AbstractEventLoop, workflow: str, block: str
    ) -> asyncio.Future[Any]:
        """The pending (or returned, not yet seen) wake-up wait of ``workflow``."""
        task = self._wake_waits.get((loop, workflow))
        if task is None:
            command = self._server.command(
                "BLPOP", self._keys.wake(workflow), block, block=float(block)
            )
            task = asyncio.ensure_future(command)
            task.add_done_callback(drop_reply)  # its error is the next claim's to meet
            self._wake_waits[loop, workflow] = task
        return task

    # -- claims ------------------------------------------------------------------------
    async def claim_runs(
        self,
        worker_id: str,
        workflows: Sequence[str],
        limit: int,
        lease_ttl: float,
        ahead: float = 0.0,
    ) -> Claimed:
        if limit <= 0:
            return Claimed()
        await self._ensure_open()
        names = list(dict.fromkeys(workflows))
        for workflow in names:
            await self._note_workflow(workflow)
        leases = Claimed()
        reset = EXPIRED_SINK.set(leases.expired)  # the claim's follow-ups report them
        try:
            if not self.cluster:
                if names:
                    leases += await self._claim_due(worker_id, names, limit, lease_ttl, ahead)
                return leases
            for workflow in names:
                if len(leases) >= limit:
                    break
                leases += await self._claim_workflow(
                    worker_id, workflow, limit - len(leases), lease_ttl, ahead
                )
            return leases
        finally:
            EXPIRED_SINK.reset(reset)

    async def _claim_workflow(
        self, worker_id: str, workflow: str, limit: int, ttl: float, ahead: float
    ) -> list[Lease]:
        """Cluster: read the workflow's hint, then claim on its due shards, one call each
        (batched by node)."""
        await self._resync(workflow)
        due = text(await self._server.call("hint_read", self._keys.hint(workflow), num(ahead)))
        shards = sorted(int(shard) for shard in due.split(",")) if due else []
        if not shards:
            return []
        owned = self.held_shards(worker_id).shards
        cursor = self._cursor.get(workflow, 0)
        groups = [
            rotate([s for s in shards if s in owned], cursor),
            rotate([s for s in shards if s not in owned], cursor),
        ]
        leases: list[Lease] = []
        for group in groups:
            open_shards = list(group)
            while open_shards and len(leases) < limit:
                remaining = limit - len(leases)
                each = quota(remaining, len(open_shards))
                plan: list[tuple[int, int]] = []
                for shard in open_shards:
                    n = min(each, remaining - sum(k for _, k in plan))
                    if n <= 0:
                        break
                    plan.append((shard, n))
                got = await self._claim_on(plan, worker_id, workflow, ttl, ahead)
                self._cursor[workflow] = cursor + len(plan)
                # A shard that gave fewer than asked is empty (for this claim).
                full = {
                    shard for (shard, n), taken in zip(plan, got, strict=False) if len(taken) >= n
                }
                for taken in got:
                    leases += taken
                visited = {shard for shard, _ in plan}
                open_shards = [s for s in open_shards if s in full or s not in visited]
                if not full and all(s in visited for s in open_shards):
                    break
        return leases

    async def _claim_due(
        self, worker_id: str, workflows: list[str], limit: int, ttl: float, ahead: float
    ) -> list[Lease]:
        """Single node: read the hints and claim on the due shards of every workflow, in
        the order given, in one call (the Lua follows the plan of the cluster path
        above); shards stopped by flow control are finished here, one by one."""
        cursor_of, first_of = self._cursor, self._shards_first
        cursors = [cursor_of.get(workflow, 0) for workflow in workflows]
        now = monotonic()
        triples: list[str] = []
        for workflow, cursor in zip(workflows, cursors, strict=True):
            due_at, dry_until = first_of.get(workflow, NEVER_READ)
            triples += (workflow, str(cursor), "h" if now >= due_at or now < dry_until else "")
        reply = await self._server.call(
            "claim_due", self._keys.hint(workflows[0]), self.namespace, worker_id,
            str(limit), num(ttl), num(ahead), str(len(workflows)), *triples,
            *self.held_shards(worker_id).args,
        )  # fmt: skip
        if reply[1] or reply[2] or reply[3]:  # hints (a cluster's) or follow-ups
            await self._after(0, reply)
        leases: list[Lease] = []
        reached = zip(workflows, cursors, reply[0], strict=False)  # the limit may stop it
        for workflow, cursor, (flat, blocked, visited, flags) in reached:
            if int(visited):
                cursor_of[workflow] = cursor + int(visited)
            # The shards are read first again after HINT_EVERY, at once while they have
            # due runs left (those came due while the ready list was served: they go
            # first), and meanwhile too if the ready list ran dry (a workflow whose runs
            # are all in the shards' queues).
            if flags:
                flags = text(flags)
                due_at, dry_until = first_of.get(workflow, NEVER_READ)
                if "h" in flags:
                    due_at = now if "s" in flags else now + HINT_EVERY
                if "d" in flags:
                    dry_until = now + HINT_EVERY
                first_of[workflow] = (due_at, dry_until)
            leases += [lease_of(text(flat[i]), flat[i + 1]) for i in range(0, len(flat), 2)]
            if blocked:
                blocked = flat_text(blocked)
            for i in range(0, len(blocked), 8):
                # What flow control holds back is claimed only up to the limit (the ready
                # list may have filled it past what the Lua owed).
                shard, owed = int(blocked[i]), min(int(blocked[i + 1]), limit - len(leases))
                if owed <= 0:
                    break
                try:
                    leases += await self._claim_rest(
                        shard, owed, [[], blocked[i + 2 : i + 8]], worker_id, workflow, ttl, ahead
                    )
                except StoreError as exc:  # the runs claimed already are returned
                    if not leases:
                        raise
                    log.warning("a claim on %s failed on shard %d: %s", self.url, shard, exc)
        return leases

    async def _claim_on(
        self, plan: list[tuple[int, int]], worker_id: str, workflow: str, ttl: float, ahead: float
    ) -> list[list[Lease]]:
        calls = [
            (s, self._shard_call("claim", s, workflow, worker_id, str(n), num(ttl), num(ahead),
                                 0, 0, 0))
            for s, n in plan
        ]  # fmt: skip
        out: list[list[Lease]] = []
        failure: BaseException | None = None
        for (shard, n), reply in zip(plan, await self._shards(calls), strict=False):
            try:
                if isinstance(reply, BaseException):
                    raise reply
                out.append(await self._claim_rest(shard, n, reply, worker_id, workflow, ttl, ahead))
            except StoreError as exc:
                # Runs claimed on the other shards are returned, not left to lapse.
                failure = failure or exc
                out.append([])
        if failure is not None and not any(out):
            raise failure
        if failure is not None:
            log.warning("a claim on %s failed on some shards: %s", self.url, failure)
        return out

    async def _claim_rest(
        self,
        shard: int,
        n: int,
        reply: Any,
        worker_id: str,
        workflow: str,
        ttl: float,
        ahead: float,
    ) -> list[Lease]:
        """Finish one shard's claim: pass flow-controlled runs through flow control."""
        got: list[Lease] = []
        capped: list[str] = []
        held: list[str] = []
        while True:
            flat, blocked = flat_text(reply)
            got += [lease_of(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
            if not blocked or len(got) >= n:
                return got
            run_id, owner, rate_key = blocked[0], blocked[1], blocked[2]
            verdict = await self._flow_take(blocked, workflow, ttl)
            admitted = [run_id] if verdict == "ok" else []
            if verdict in ("cap", "held"):
                # The cap holds all the owner's runs; or the run at its head holds a slot
                # another claimer took for it (theirs to run and to free: releasing it here
                # when this claim did not get the run let a second run of the owner in).
                capped.append(owner)
            elif verdict == "rate":
                held += [owner, rate_key]  # runs of other keys behind it may go
            reply = await self._shard(
                "claim", shard, workflow, worker_id, str(n - len(got)), num(ttl), num(ahead),
                str(len(admitted)), *admitted, str(len(capped)), *capped,
                str(len(held) // 2), *held,
            )  # fmt: skip
            if admitted and run_id not in flat_text(reply)[0][::2]:
                await self._flow_release(workflow, owner, run_id)

    async def _resync(self, workflow: str) -> None:
        """Rewrite a workflow's hints from every shard now and then (cluster only): a
        process that died between a shard call and its hint write left a stale hint."""
        now = monotonic()
        if now - self._resynced.get(workflow, 0.0) < RESYNC_INTERVAL:
            return
        self._resynced[workflow] = now
        calls = [(s, self._shard_call("sync", s, workflow)) for s in range(self.shard_count)]
        for reply in await self._shards(calls):
            if isinstance(reply, BaseException):
                raise reply

    # -- leases ------------------------------------------------------------------------
    async def renew_leases(
        self, worker_id: str, leases: Sequence[tuple[str, int]], lease_ttl: float
    ) -> RenewResult:
        if not leases:
            return RenewResult()
        by_shard: dict[int, list[int]] = {}
        for index, (run_id, _) in enumerate(leases):
            by_shard.setdefault(self._keys.shard_of(run_id), []).append(index)
        calls = [
            (
                shard,
                self._shard_call(
                    "renew", shard, num(lease_ttl),
                    *[x for i in indexes for x in (leases[i][0], str(leases[i][1]))],
                ),
            )
            for shard, indexes in by_shard.items()
        ]  # fmt: skip
        status: dict[int, str] = {}
        for (shard, _), reply in zip(calls, await self._shards(calls), strict=False):
            if isinstance(reply, BaseException):
                raise reply
            for index, state in zip(by_shard[shard], flat_text(reply)[0], strict=False):
                status[index] = state
        ordered = [(leases[i][0], status[i]) for i in range(len(leases))]
        return RenewResult(
            lost=tuple(run_id for run_id, s in ordered if s == "lost"),
            cancel_requested=tuple(run_id for run_id, s in ordered if s == "cancel"),
        )

    async def load_journal(self, run_id: str) -> list[JournalEntry]:
        await self._ensure_open()
        flat = await self._server.command("HGETALL", self._keys.journal(run_id))
        items = flat.items() if isinstance(flat, dict) else zip(flat[::2], flat[1::2], strict=False)
        entries = [to_entry(run_id, int(text(k)), text(v)) for k, v in items]
        return sorted(entries, key=lambda e: e.position)

    async def append_journal(self, token: int, entry: JournalEntry) -> bool:
        reply = flat_text(
            await self._run_call(
                "append", entry.run_id, entry.run_id, str(token), *entry_args(entry),
            )
        )  # fmt: skip
        if reply[0] == "nondet":
            raise nondeterminism(entry.run_id, entry.position, reply[1], entry)
        return bool(reply[1] == "1")

    async def finish_run(
        self, run_id: str, token: int, outcome: Outcome, entry: JournalEntry | None = None
    ) -> RunRecord:
        check_finish_outcome(outcome, run_id, entry)
        args = [
            run_id, str(token), outcome.status.value,
            "0" if outcome.result is None else "1", outcome.result or "",
            "0" if outcome.error is None else "1", outcome.error or "",
            "" if outcome.failed_position is None else str(int(outcome.failed_position)),
            *(("", "", "") if entry is None else entry_args(entry)),
        ]  # fmt: skip
        if self.cluster:
            reply = flat_text(await self._run_call("finish", run_id, *args))
        else:  # with the other finishes of this turn of the loop (finishing.py)
            await self._ensure_open()
            reply = flat_text(await self._finishes.finish(self._keys.shard_of(run_id), args))
        if reply[0] == "nondet":
            assert entry is not None
            raise nondeterminism(run_id, entry.position, reply[1], entry)
        return to_run(run_id, reply[1])

    async def release_run(self, run_id: str, token: int, available_at: float | None = None) -> None:
        at = "" if available_at is None else num(available_at)
        await self._run_call("release", run_id, run_id, str(token), at)

    async def set_progress(self, run_id: str, token: int, state: str, info: str) -> None:
        await self._run_call("set_progress", run_id, run_id, str(token), state, info)

    async def suspend_run(self, run_id: str, token: int, wait: Wait) -> bool:
        child_here = "1"
        if wait.child is not None and self._keys.shard_of(wait.child) != self._keys.shard_of(
            run_id
        ):
            child_here = "0"
            child = await self.get_run(wait.child)
            if child is None:
                raise RunNotFound(f"no run with id {wait.child!r} in {self.url}")
            if child.is_terminal:
                return False
        signal_key = "" if wait.signal is None else self._keys.signal(run_id, wait.signal)
        reply = await self._run_call(
            "suspend", run_id, signal_key, run_id, str(token),
            "" if wait.wake_at is None else num(wait.wake_at),
            "0" if wait.signal is None else "1", wait.signal or "", wait.child or "", child_here,
        )  # fmt: skip
        return text(reply) == "1"

    # -- recovery ----------------------------------------------------------------------
    async def recover_expired(self, max_recoveries: int, limit: int) -> RecoveryReport:
        if limit <= 0:
            return RecoveryReport()
        await self._ensure_open()
        requeued: list[str] = []
        dead: list[str] = []
        candidates: list[tuple[int, str, str]] = []  # (shard, run_id, token)
        if not self.cluster:  # runs claimed from ready lists (claim_due.lua claim_ready)
            ids, found = flat_text(
                await self._server.call(
                    "recover_lists",
                    self._keys.meta,
                    self.namespace,
                    str(max_recoveries),
                    str(limit),
                )
            )
            requeued += ids
            candidates += [
                (int(found[i + 2]), found[i], found[i + 1]) for i in range(0, len(found), 3)
            ]
        start = self._recover_from
        self._recover_from = (start + 1) % self.shard_count
        for step in range(self.shard_count):
            remaining = limit - len(requeued) - len(candidates)
            if remaining <= 0:
                break
            shard = (start + step) % self.shard_count
            ids, found = flat_text(
                await self._shard("recover", shard, str(max_recoveries), str(remaining))
            )
            requeued += ids
            candidates += [(shard, found[i], found[i + 1]) for i in range(0, len(found), 2)]
        for shard, run_id, token in candidates:
            run = await self.get_run(run_id)
            if run is None:
                continue
            error = dead_letter_error(run, max_recoveries)
            verdict = await self._shard(
                "dead_letter", shard, run_id, token, str(max_recoveries), error
            )
            if text(verdict) == "1":
                dead.append(run_id)
        return RecoveryReport(requeued=tuple(requeued), dead=tuple(dead))
