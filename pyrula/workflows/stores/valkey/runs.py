"""ValkeyStore's client-side run operations, signals and child runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.errors import (
    InvalidRunState,
    NondeterminismError,
    RunNotFound,
    StoreError,
)
from pyrula.workflows.records import JournalEntry, NewRun, RunRecord, RunStatus
from pyrula.workflows.stores.rules import idempotency_conflict, idempotency_matches
from pyrula.workflows.stores.valkey.codec import (
    entry_args,
    entry_head,
    new_run_args,
    new_run_from_reservation,
    num,
    pack_entry,
    pairs,
    ready_args,
    ready_run,
    text,
    to_run,
    unpack_entry,
)
from pyrula.workflows.stores.valkey.connection import Call
from pyrula.workflows.stores.valkey.core import ValkeyCore, flat_text, monotonic


def nondeterminism(run_id: str, position: int, packed: str, entry: JournalEntry) -> Exception:
    kind, name, _, _ = unpack_entry(packed)
    return NondeterminismError(
        f"run {run_id!r} already recorded {kind} {name!r} at position {position}, "
        f"not {entry.kind} {entry.name!r}"
    )


class RunOps(ValkeyCore):
    """Creating, reading, waiting for, cancelling and retrying runs; signals; children."""

    block_slice: float
    _purge_turn: int
    _owned_workflows: dict[str, int]
    """Workflows create_ready refused (an owned run was submitted to them: for good, as
    long as the server keeps its data), with the server generation that said so."""

    # -- create ------------------------------------------------------------------------
    async def create_run(self, new: NewRun) -> tuple[RunRecord, bool]:
        await self._ensure_open()
        await self._note_workflow(new.workflow)
        if new.idempotency_key is None:
            return (await self._insert(new, allow_existing=False))[0], True
        return await self._create_keyed(new, new.idempotency_key)

    async def _insert(self, new: NewRun, *, allow_existing: bool) -> tuple[RunRecord, bool]:
        ready = None if allow_existing else self._ready_call(new)
        if ready is not None:
            name, key, args = ready
            reply = flat_text(await self._server.call(name, key, *args))
            if reply[0] == "created":
                return ready_run(new, reply[1], reply[2]), True
            self._note_owned_workflow(new.workflow)
        payload = flat_text(
            await self._run_call(
                "create", new.run_id, *new_run_args(new), "1" if allow_existing else "0"
            )
        )
        return to_run(new.run_id, payload[1]), payload[0] == "created"

    def _ready_call(self, new: NewRun) -> Call | None:
        """The create_ready call for ``new`` on a single node, unless ``new`` or its
        workflow takes ``create`` (see codec.ready_args; an owned run was submitted to
        the workflow: create_ready said so once)."""
        if self.cluster or self._owned_workflows.get(new.workflow) == self._server.generation:
            return None
        args = ready_args(new)
        if args is None:
            return None
        return self._shard_call("create_ready", self._keys.shard_of(new.run_id), *args)

    def _note_owned_workflow(self, workflow: str) -> None:
        """create_ready answered "owned" for ``workflow``: use create from now on."""
        self._owned_workflows[workflow] = self._server.generation

    async def _create_keyed(self, new: NewRun, key: str) -> tuple[RunRecord, bool]:
        """Reserve the key in its own shard, then create the run in the run's shard.

        The reservation holds the whole NewRun, so a creation left halfway (a process
        dying between the two calls) is finished by the next caller with that key.
        """
        reserved = await self._reserve(new, key)
        if reserved is None:
            return await self._create_reserved(new, key), True
        return await self._existing_for(reserved, new, key), False

    async def _reserve(self, new: NewRun, key: str) -> NewRun | None:
        """Take ``key`` for ``new``: None if taken now, else the NewRun holding it (after
        checking it is the same request: IdempotencyConflict otherwise)."""
        args = new_run_args(new)
        reservation = [key, args[0], *args[1:4], *args[6:14]]
        shard = self._keys.shard(self._keys.shard_of_key(key))
        verdict, fields = await self._server.call("idem_reserve", shard, *reservation)
        if text(verdict) == "reserved":
            return None
        holder = new_run_from_reservation(key, pairs(fields))
        if holder.workflow != new.workflow or holder.params != new.params:
            existing = await self.get_run(holder.run_id) or await self._existing_for(
                holder, holder, key
            )
            raise idempotency_conflict(key, existing, new)
        return holder

    async def _create_reserved(self, new: NewRun, key: str) -> RunRecord:
        try:
            return (await self._insert(new, allow_existing=True))[0]
        except InvalidRunState:
            await self._release_key(new, key)
            raise

    async def _release_key(self, new: NewRun, key: str) -> None:
        shard = self._keys.shard(self._keys.shard_of_key(key))
        await self._server.call("idem_release", shard, key, new.run_id)

    async def _existing_for(self, holder: NewRun, new: NewRun, key: str) -> RunRecord:
        """The run a taken key names, created from its reservation if it is not yet."""
        existing = await self.get_run(holder.run_id)
        if existing is None:
            existing, _ = await self._insert(holder, allow_existing=True)
        if not idempotency_matches(existing, new):
            raise idempotency_conflict(key, existing, new)
        return existing

    # -- read --------------------------------------------------------------------------
    async def get_run(self, run_id: str) -> RunRecord | None:
        await self._ensure_open()
        flat = await self._server.command("HGETALL", self._keys.run(run_id))
        if not flat:
            return None
        return to_run(run_id, _hash(flat))

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        owner: str | None = None,
        limit: int = 100,
    ) -> list[RunRecord]:
        """Each shard walks its history index newest first; queued runs are read from the
        queues instead (``_list_queued``), so that finding the few queued runs among a
        long history does not walk it (a worker of the Celery drop-in does at start)."""
        if limit <= 0:
            return []
        args = (
            "0" if workflow is None else "1",
            workflow or "",
            "" if status is None else status.value,
            "0" if owner is None else "1",
            owner or "",
        )
        if status is RunStatus.QUEUED:
            return await self._list_queued(workflow, args, limit)
        return await self._list_history(args, limit)

    async def _list_history(self, args: tuple[str, ...], limit: int) -> list[RunRecord]:
        """The ``list`` walk of every shard's history (``args``: its filters)."""
        # Each shard lists up to limit, LIST_BUDGET history entries a call, LIST_GROUP
        # calls a round trip: a long history never keeps the server busy for long at once.
        wanted = dict.fromkeys(range(self.shard_count), limit)
        going_on = dict.fromkeys(range(self.shard_count), "")
        replies: list[Any] = []
        while going_on:
            shards = list(going_on)[:LIST_GROUP]
            calls = [
                (s, self._shard_call("list", s, *args, str(wanted[s]), LIST_BUDGET, going_on[s]))
                for s in shards
            ]
            for shard, reply in zip(shards, await self._shards(calls), strict=True):
                if isinstance(reply, BaseException):
                    raise reply
                found, after = reply
                replies.append(found)
                wanted[shard] -= len(found) // 2
                going_on[shard] = text(after)
                if not going_on[shard] or wanted[shard] <= 0:
                    del going_on[shard]
        return _newest(replies, limit)

    async def _list_queued(
        self, workflow: str | None, args: tuple[str, ...], limit: int
    ) -> list[RunRecord]:
        """The queued runs of ``workflow`` (or of every workflow the namespace has seen:
        the meta hash records each at its first use): each shard's queues, and on a single
        node the ready lists too (``args``: the history walk's filters)."""
        has_owner, owner = args[3], args[4]
        if workflow is not None:
            names = [workflow]
        else:
            fields = await self._server.command("HKEYS", self._keys.meta)
            names = sorted(f[2:] for f in map(text, fields) if f.startswith("w:"))
        if not names:
            return []
        # First how many there are (cheap): with a backlog, the history walk finds the
        # newest queued runs at once, while reading every queue would cost the backlog.
        counted = 0
        for reply in await self._queue_calls(has_owner, owner, 0, names):
            if isinstance(reply, BaseException):
                raise reply
            counted += int(text(reply))
        if counted > QUEUE_READ_MAX:
            return await self._list_history(args, limit)
        return _newest(await self._queue_calls(has_owner, owner, limit, names), limit)

    async def _queue_calls(
        self, has_owner: str, owner: str, limit: int, names: list[str]
    ) -> list[Any]:
        """list_ready (single node) then list_queued on every shard: a run that moves from
        a ready list to a shard's queue meanwhile (a workflow's first owned run moves them
        all) is then seen twice, not missed; _newest keeps one."""
        args = (has_owner, owner, str(limit), *names)
        replies: list[Any] = []
        if not self.cluster:
            ready = ("list_ready", self._keys.hint(names[0]), (self.namespace, *args))
            replies += await self._server.call_many([ready])
        calls = [(s, self._shard_call("list_queued", s, *args)) for s in range(self.shard_count)]
        return replies + await self._shards(calls)

    async def delete_run(self, run_id: str) -> bool:
        return text(await self._run_call("delete_run", run_id, run_id)) == "1"

    async def purge_runs(self, ended_before: float, limit: int) -> int:
        """Each shard forgets its share of ``limit`` (its runs that ended first), all in one
        round trip per node; the shards given one more than the others take turns."""
        if limit <= 0:
            return 0
        count = self.shard_count
        each, extra = divmod(limit, count)
        first = self._purge_turn
        self._purge_turn = (first + extra) % count
        quotas = [(s, each + (1 if (s - first) % count < extra else 0)) for s in range(count)]
        before = num(ended_before)
        calls = [(s, self._shard_call("purge", s, before, str(q))) for s, q in quotas if q]
        purged = 0
        for reply in await self._shards(calls):
            if isinstance(reply, BaseException):
                raise reply
            purged += int(text(reply))
        return purged

    async def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        deadline = None if timeout is None else monotonic() + timeout
        closed = self._notifier.register("close")
        try:
            while True:
                run = await self.get_run(run_id)
                if run is None:
                    raise RunNotFound(f"no run with id {run_id!r} in {self.url}")
                remaining = None if deadline is None else deadline - monotonic()
                if run.is_terminal or self._notifier.closed:
                    return run
                if remaining is not None and remaining <= 0:
                    return run
                block = self.block_slice if remaining is None else min(remaining, self.block_slice)
                done = self._keys.done(run_id)
                # Every waiter rotates the list in place, so one push wakes them all.
                try:
                    await self._block(closed, "BLMOVE", done, done, "RIGHT", "LEFT", _secs(block))
                except StoreError:
                    if not self._notifier.closed:
                        raise
                if self._notifier.closed:
                    # close() woke us: the record read last, not a read on connections
                    # that are being closed under it.
                    return run
        finally:
            self._notifier.unregister("close", closed)

    async def _block(self, closed: asyncio.Future[None], *command: Any) -> Any:
        """Run a blocking command (its timeout last) unless close() comes first (then it
        is abandoned)."""
        block = float(command[-1])
        task = asyncio.ensure_future(self._server.command(*command, block=block))
        try:
            await asyncio.wait([task, closed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        return None if task.cancelled() else task.result()

    # -- control -----------------------------------------------------------------------
    async def cancel_run(self, run_id: str) -> RunRecord:
        return to_run(run_id, flat_text(await self._run_call("cancel", run_id, run_id)))

    async def terminate_run(self, run_id: str) -> RunRecord:
        return to_run(run_id, flat_text(await self._run_call("terminate", run_id, run_id)))

    async def wait_lease_news(self, worker_id: str, timeout: float) -> bool:
        """``BLPOP`` on the worker's news list, which a cancel or terminate of a run it
        holds pushes (``_tell``, through the Lua's ``news`` follow-ups), in slices."""
        if timeout <= 0 or self._notifier.closed:
            return False
        await self._ensure_open()
        key = self._keys.lease_news(worker_id)
        deadline = monotonic() + timeout
        closed = self._notifier.register("close")
        try:
            while not closed.done():
                left = deadline - monotonic()
                if left <= 0:
                    return False
                block = f"{max(0.01, min(left, self.block_slice)):.3f}"
                if await self._block(closed, "BLPOP", key, block):
                    with contextlib.suppress(StoreError):  # one renewal answers all
                        await self._server.command("DEL", key)
                    return True
            return False
        finally:
            self._notifier.unregister("close", closed)

    async def retry_run(
        self, run_id: str, remove: Sequence[int] = (), *, seen_claims: int | None = None
    ) -> RunRecord:
        seen = "" if seen_claims is None else str(int(seen_claims))
        positions = [str(int(position)) for position in remove]
        reply = await self._run_call("retry", run_id, run_id, seen, *positions)
        return to_run(run_id, flat_text(reply))

    # -- signals -----------------------------------------------------------------------
    async def send_signal(self, run_id: str, name: str, payload: str) -> None:
        await self._run_call(
            "send_signal", run_id, self._keys.signal(run_id, name), run_id, name, payload
        )

    async def consume_signal(self, token: int, entry: JournalEntry) -> str | None:
        run_id = entry.run_id
        reply = flat_text(
            await self._run_call(
                "consume_signal",
                run_id,
                self._keys.signal(run_id, entry.name),
                run_id,
                str(token),
                str(entry.position),
                str(entry.attempts),
                entry_head(entry.kind, entry.name),
                "1" if entry.ok else "0",
            )
        )
        verdict = reply[0]
        if verdict == "consumed":
            return str(reply[1])
        if verdict == "journaled":
            return unpack_entry(reply[1])[3]
        if verdict == "nondet":
            raise nondeterminism(run_id, entry.position, reply[1], entry)
        return None

    # -- child runs --------------------------------------------------------------------
    async def start_child(self, token: int, entry: JournalEntry, child: NewRun) -> RunRecord:
        parent = entry.run_id
        head = (str(token), str(entry.position))
        if (
            self._keys.shard_of(child.run_id) == self._keys.shard_of(parent)
            and child.idempotency_key is None
        ):
            await self._note_workflow(child.workflow)
            reply = flat_text(
                await self._run_call(
                    "start_child",
                    parent,
                    parent,
                    str(token),
                    *entry_args(entry),
                    *new_run_args(child),
                )
            )
            if reply[0] == "nondet":
                raise nondeterminism(parent, entry.position, reply[1], entry)
            return to_run(child.run_id, reply[1])
        # The child lives on another shard: check, create it, then journal the start.
        reply = flat_text(
            await self._run_call("check_entry", parent, parent, *head, pack_entry(entry))
        )
        if reply[0] == "nondet":
            raise nondeterminism(parent, entry.position, reply[1], entry)
        record, _ = await self.create_run(child)
        reply = flat_text(
            await self._run_call(
                "append_child", parent, parent, str(token), *entry_args(entry), child.run_id
            )
        )
        if reply[0] == "nondet":
            raise nondeterminism(parent, entry.position, reply[1], entry)
        return record


def _hash(flat: Any) -> dict[str, str]:
    """HGETALL's reply (a dict from valkey-py, or a flat list) as str -> str."""
    if isinstance(flat, dict):
        return {text(k): text(v) for k, v in flat.items()}
    return pairs(flat)


def _secs(seconds: float) -> str:
    return f"{max(seconds, 0.01):.3f}"


LIST_BUDGET = "1000"
"""History entries one shard's list call looks at, at most (~3 ms of the server's time)."""
LIST_GROUP = 4
"""Shard list calls sent in one round trip: the server is busy ~10 ms with them."""
QUEUE_READ_MAX = 4000
"""Queued runs (of the workflows and owner asked for) up to which a listing of queued runs
reads the queues; past it, it walks the history, whose newest runs are then mostly the
queued ones."""


def _newest(replies: list[Any], limit: int) -> list[RunRecord]:
    """The runs of several ``{run_id, packed run, ...}`` replies, newest first (by
    created_at, then submission on their shard, then id: runs of two shards may share
    both), each once, at most ``limit``."""
    found: dict[str, tuple[float, int, str, RunRecord]] = {}
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
        flat = flat_text(reply)
        for i in range(0, len(flat), 2):
            fields = pairs(flat[i + 1])
            run = to_run(flat[i], fields)
            found[run.run_id] = (run.created_at, int(fields["sq"]), run.run_id, run)
    ordered = sorted(found.values(), key=lambda item: item[:3], reverse=True)
    return [item[3] for item in ordered[:limit]]
