"""Single node: the finishes of one event-loop turn go to the server in one call.

A worker's runs often end together: a claim starts several at once, and short ones end
in the same turn of the loop. Each ``finish_run`` of a single-node ValkeyStore joins the
turn's batch, sent at the loop's next turn (by a task the batch's first finish starts)
as one ``finish_many`` (lua/leases.lua): one round trip and one ``TIME`` for all, and
one run of the server's Lua instead of one per finish (Performance § 6 measures what
that saves). A batch holds at most ``MAX_BATCH`` finishes and about ``MAX_BATCH_BYTES``
of arguments; past either, the next finish starts a new batch.

Each finish keeps its own outcome: a lost lease fails that finish alone, and its reply
goes through the store's follow-ups as a ``finish`` call's would, its waiter resolved as
soon as they are done. A call that fails as a whole fails every finish in it (as a
single finish whose reply was lost, each may or may not have been written). A finish
whose caller is cancelled once its batch is on its way is still written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from valkey import exceptions as vex

from pyrula.workflows.errors import StoreError
from pyrula.workflows.stores.valkey.codec import FINISH_FIELDS, text
from pyrula.workflows.stores.valkey.connection import VANISHED

if TYPE_CHECKING:
    from pyrula.workflows.stores.valkey.core import ValkeyCore

MAX_BATCH = 64
MAX_BATCH_BYTES = 1 << 20

Pending = tuple[int, Sequence[str], "asyncio.Future[Any]"]
"""(shard, finish's FINISH_FIELDS arguments, the waiter)"""


class _Batch:
    def __init__(self) -> None:
        self.items: list[Pending] = []
        self.size = 0


class FinishBatches:
    """The open batch of each event loop, and the sends in flight."""

    def __init__(self, store: ValkeyCore) -> None:
        self._store = store
        self._open: dict[asyncio.AbstractEventLoop, _Batch] = {}
        self._sending: set[asyncio.Task[None]] = set()

    async def finish(self, shard: int, args: Sequence[str]) -> Any:
        """finish's payload for ``args`` (finish's ARGV[4..]), sent with the other
        finishes of this turn of the loop; its error raised."""
        assert len(args) == FINISH_FIELDS, args
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        batch = self._open.get(loop)
        new = batch is None
        if batch is None:
            for closed in [other for other in self._open if other.is_closed()]:
                self._fail(self._open.pop(closed), StoreError("its event loop closed"))
            batch = self._open[loop] = _Batch()
        batch.items.append((shard, args, waiter))
        batch.size += sum(map(len, args))
        if new:
            try:
                self._spawn(loop, batch)
            except BaseException:
                self._close(loop, batch)
                raise
        if len(batch.items) >= MAX_BATCH or batch.size >= MAX_BATCH_BYTES:
            self._close(loop, batch)
        return await waiter

    def _spawn(self, loop: asyncio.AbstractEventLoop, batch: _Batch) -> None:
        # With the default task factory the task's first step runs in the loop's next
        # turn, when every finish of this turn has joined; an eager one sends at once.
        task = loop.create_task(self._send(loop, batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        task.add_done_callback(lambda _: self._close(loop, batch, unsent=True))

    def _close(self, loop: asyncio.AbstractEventLoop, batch: _Batch, unsent: bool = False) -> None:
        """Take ``batch`` out of the open ones; with ``unsent`` (its task ended without
        sending it: cancelled before its first step), fail its finishes too."""
        if self._open.get(loop) is batch:
            del self._open[loop]
            if unsent:
                self._fail(batch, StoreError("finish_many was never sent: outcome unknown"))

    @staticmethod
    def _fail(batch: _Batch, error: BaseException) -> None:
        for *_, waiter in batch.items:
            if not waiter.done():
                waiter.set_exception(error)

    async def drain(self) -> None:
        """Wait for this loop's sends in flight (their finishes may already be written)."""
        loop = asyncio.get_running_loop()
        mine = [task for task in self._sending if task.get_loop() is loop]
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)

    async def _send(self, loop: asyncio.AbstractEventLoop, batch: _Batch) -> None:
        self._close(loop, batch)
        try:
            await self._call(batch.items)
        except asyncio.CancelledError:
            self._fail(batch, StoreError("finish_many was cancelled: outcome unknown"))
            raise
        except Exception as exc:  # the call failed: every finish in it did
            self._fail(batch, exc)
        finally:  # whatever happened, no waiter is left pending
            self._fail(batch, StoreError("finish_many ended without an outcome"))

    async def _call(self, items: list[Pending]) -> None:
        store = self._store
        if not items:
            return
        flat: list[str] = []
        for shard, args, _ in items:
            flat += (str(shard), *args)
        replies = await store._server.call(
            "finish_many", store._keys.shard(items[0][0]), store.namespace,
            str(len(items)), *flat,
        )  # fmt: skip
        if not isinstance(replies, list) or len(replies) != len(items):
            raise StoreError(f"unexpected reply to finish_many: {str(replies)[:200]}")
        vanished: list[tuple[asyncio.Future[Any], BaseException]] = []
        for (shard, _, waiter), (ok, value) in zip(items, replies, strict=True):
            outcome: Any
            if int(ok):
                try:
                    outcome = await store._after(shard, value)
                except Exception as exc:
                    outcome = exc
            else:
                outcome = store._server.translate(vex.ResponseError(text(value)))
                if isinstance(outcome, VANISHED):
                    vanished.append((waiter, outcome))
                    continue
            _resolve(waiter, outcome)
        if vanished:
            try:
                await store._server.verify()  # a run we knew of is gone: was the data flushed?
            except Exception as exc:
                vanished = [(waiter, exc) for waiter, _ in vanished]
            for waiter, error in vanished:
                _resolve(waiter, error)


def _resolve(waiter: asyncio.Future[Any], outcome: Any) -> None:
    if waiter.done():
        return
    if isinstance(outcome, BaseException):
        waiter.set_exception(outcome)
    else:
        waiter.set_result(outcome)
