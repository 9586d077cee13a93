"""ValkeyStore's purge of runs that wait to start (:func:`pyrula.workflows.purging.
purge_queued`, which ``app.control.purge()``, ``pyrula purge`` and ``pyrula worker
--purge`` use), read from the queues a page at a time, each page one atomic call.

The generic purge lists the queued runs again from the newest for every page, which on
Valkey past ``runs.QUEUE_READ_MAX`` queued runs is a walk of the history, longer with
every page. Here each call resumes just after the last run the previous one kept
(lua/purge.lua), so a page costs the runs it reads and the purge the runs queued:

* on a single node, the workflow's ready list first, from its head, each call
  ``page_size`` entries, until its end or a run sent after the purge began (the list is
  FIFO: every entry behind that one came later);
* then every shard's queues of the workflow (the default owner's, then the named
  owners' due index), ``page_size`` runs a call, ``SHARD_GROUP`` shards a round trip.

A call reads at most ``PAGE_MAX`` runs, so that no call keeps the server long.

What is purged is what the generic purge cancels: runs queued, never started and created
no later than the purge began, each ended as ``cancel_run`` leaves a queued run
(``cancelled``, ``cancel_requested``; a Celery task reads ``REVOKED``), its descendants
cancelled with it; started runs (running, sleeping, waiting, or queued again) are left
alone. A run a worker claims before its page is read is not purged. Runs that a
workflow's first owned submission moves from its ready list into the shards' queues
while the purge reads those queues may be passed over (that move happens once per
workflow, ever).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyrula.workflows.stores.valkey.codec import num, text
from pyrula.workflows.stores.valkey.core import ValkeyCore, flat_text

PAGE_MAX = 200
"""Runs one call reads at most, whatever the page size asked: purging 200 runs keeps the
server busy 6 to 15 ms (measured on one local valkey-server; the fair queues of named
owners cost the most)."""
SHARD_GROUP = 2
"""Shard calls of a purge sent in one round trip."""


class QueuedPurge(ValkeyCore):
    """``purge_queued``: see the module's docstring."""

    async def purge_queued(self, workflows: Sequence[str], began: float, page_size: int) -> int:
        """End every run of ``workflows`` that waits to start and was created at or before
        ``began`` (store time) as cancelled; return how many this call ended. Each call to
        the server reads at most ``page_size`` runs (and at most ``PAGE_MAX``)."""
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        page_size = min(page_size, PAGE_MAX)
        await self._ensure_open()
        purged = 0
        for workflow in dict.fromkeys(workflows):
            if not self.cluster:
                purged += await self._purge_ready(workflow, began, page_size)
            purged += await self._purge_shards(workflow, began, page_size)
        return purged

    async def _purge_ready(self, workflow: str, began: float, page_size: int) -> int:
        """Single node: the workflow's ready list, a page a call from its head."""
        purged, after, at = 0, "", "0"
        while True:
            reply = await self._server.call(
                "purge_ready", self._keys.hint(workflow), self.namespace, num(began),
                str(page_size), after, at,
            )  # fmt: skip
            count, after, at, more = flat_text(await self._after(0, reply))
            purged += int(count)
            if more != "1":
                return purged

    async def _purge_shards(self, workflow: str, began: float, page_size: int) -> int:
        """Every shard's queues of the workflow, each shard a page a call from where its
        last call stopped, until every shard has none left to read."""
        places = {shard: ("", "") for shard in range(self.shard_count)}
        purged = 0
        while places:
            shards = list(places)[:SHARD_GROUP]
            calls = [
                (s, self._shard_call("purge_queued", s, workflow, num(began), str(page_size),
                                     *places[s]))
                for s in shards
            ]  # fmt: skip
            for shard, reply in zip(shards, await self._shards(calls), strict=True):
                if isinstance(reply, BaseException):
                    raise reply
                count, default, named, more = (text(x) for x in reply)
                purged += int(count)
                if more == "1":
                    places[shard] = (default, named)
                else:
                    del places[shard]
        return purged
