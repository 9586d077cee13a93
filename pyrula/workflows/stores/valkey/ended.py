"""ValkeyStore.ended_runs: the shards' ended indexes (``P e``), merged. Plain reads.

Each shard keeps its ended runs in the zset ``P e``, scored by ``finished_at``: the Lua's
``end_run`` adds a run under the very text of its record's ``fa`` field (``%.17g``), so
the score and the record hold the same double, and ``retry`` takes it out. Members of
one score are ordered by their bytes, so a shard's order is ``(finished_at, run_id)``.

A page asks every shard for the entries that follow the cursor, a share of what it still
needs each (one round trip per node), then takes, in ``(score, member)`` order, those up
to the lowest last entry of the shards that gave all they were asked for (beyond it, such
a shard may have more); then reads their records (one round trip per node). An entry
whose record is gone, is not terminal or ended at another time is skipped: a purge that
keeps a child run (its parent is still there) moves the child's entry to the time of
the purge (runs.lua), and an entry a build without this index left may be stale. The
page goes on until it holds ``limit`` runs or every shard is done.

Seeking past the cursor ``(t, id)`` among the runs that ended at ``t`` has no command
(``BYLEX`` wants a single score): the cursor's own shard finds ``id`` by ``ZRANK`` and
reads on by rank (checking that the rank still holds ``id``); the others count their
members at ``t`` and read them all with what follows, dropping those up to ``id``. Many
runs end at one instant only on one shard (a tree cancelled at once), where ZRANK serves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyrula.workflows.errors import StoreError
from pyrula.workflows.records import RunRecord
from pyrula.workflows.stores.valkey.codec import num, pairs, text, to_run
from pyrula.workflows.stores.valkey.core import ValkeyCore

Entry = tuple[float, str]
"""An entry of an ended index: (score, member)."""

SHARE_MIN = 16
"""What a page asks of each shard at least (when it needs that many)."""
STALLS_MAX = 20
"""Rounds in a row that may take nothing while a shard is not done (its index changed
under the read); past them the call gives up with StoreError."""


@dataclass
class _Read:
    """One shard's read: the entries past the cursor, and where it stopped."""

    entries: list[Entry]
    bound: Entry | None
    """None: the shard has nothing past these; else what it may have lies past this."""


class EndedRuns(ValkeyCore):
    """``ended_runs`` over every shard's ended index."""

    async def ended_runs(self, after: tuple[float, str] | None, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []
        await self._ensure_open()
        out: list[RunRecord] = []
        cursor = None if after is None else (float(after[0]), after[1])
        by_rank, stalls = True, 0
        while len(out) < limit:
            need = limit - len(out)
            reads = await self._read_shards(cursor, need, by_rank)
            bounds = [read.bound for read in reads if read.bound is not None]
            bound = min(bounds) if bounds else None
            pool = sorted(entry for read in reads for entry in read.entries)
            take = [entry for entry in pool if bound is None or entry <= bound][:need]
            if not take:
                if bound is None:
                    break  # every shard is done
                stalls += 1
                by_rank = False  # a rank that no longer held the cursor: read the group
                if stalls > STALLS_MAX:
                    raise StoreError(
                        f"Valkey at {self.url}: the ended index kept changing under "
                        f"ended_runs after {cursor!r}"
                    )
                continue
            stalls = 0
            out += await self._ended_records(take)
            cursor = take[-1]
            if bound is None and len(take) == len(pool):
                break  # all there was
        return out

    async def _read_shards(self, cursor: Entry | None, need: int, by_rank: bool) -> list[_Read]:
        """Every shard's entries past ``cursor``, up to a share of ``need`` each."""
        count = self.shard_count
        share = min(need, max(SHARE_MIN, math.ceil(2 * need / count)))
        keys = [self._keys.ended(s) for s in range(count)]
        if cursor is None:
            replies = await self._server.commands(
                [("ZRANGE", key, 0, share - 1, "WITHSCORES") for key in keys]
            )
            return [_tail(scored(reply), None, share) for reply in replies]
        at, after_id = cursor
        t = num(at)
        home = self._keys.shard_of(after_id)
        first: list[tuple[Any, ...]] = [("ZCOUNT", key, t, t) for key in keys]
        if by_rank:
            first += [("ZSCORE", keys[home], after_id), ("ZRANK", keys[home], after_id)]
        found = await self._server.commands(first)
        ranked = (
            by_rank
            and found[count] is not None
            and found[count + 1] is not None
            and float(text(found[count])) == at
        )
        second: list[tuple[Any, ...]] = []
        for shard, key in enumerate(keys):
            if ranked and shard == home:  # from the cursor's own entry on, by rank
                rank = int(found[count + 1])
                second.append(("ZRANGE", key, rank, rank + share, "WITHSCORES"))
            else:  # the members at t, then what follows
                n = int(found[shard]) + share
                second.append(("ZRANGE", key, t, "+inf", "BYSCORE", "LIMIT", 0, n, "WITHSCORES"))
        reads: list[_Read] = []
        for shard, reply in enumerate(await self._server.commands(second)):
            entries = scored(reply)
            if ranked and shard == home:
                if not entries or entries[0] != cursor:  # the index moved meanwhile
                    reads.append(_Read([], cursor))
                    continue
                reads.append(_tail(entries[1:], cursor, share))
            else:
                reads.append(_tail(entries, cursor, int(found[shard]) + share))
        return reads

    async def _ended_records(self, entries: Sequence[Entry]) -> list[RunRecord]:
        """The runs of ``entries`` still ended at their entry's time, in that order."""
        replies = await self._server.commands(
            [("HGETALL", self._keys.run(run_id)) for _, run_id in entries]
        )
        runs: list[RunRecord] = []
        for (at, run_id), reply in zip(entries, replies, strict=True):
            fields = fields_of(reply)
            if not fields:
                continue  # gone since (purged, deleted)
            run = to_run(run_id, fields)
            if run.is_terminal and run.finished_at == at:
                runs.append(run)
        return runs


def _tail(entries: list[Entry], cursor: Entry | None, asked: int) -> _Read:
    """A shard's read of ``asked`` entries: those past ``cursor``, and its bound."""
    past = entries if cursor is None else [entry for entry in entries if entry > cursor]
    if len(entries) < asked:
        return _Read(past, None)
    return _Read(past, past[-1] if past else cursor)


def scored(reply: Any) -> list[Entry]:
    """A ``WITHSCORES`` reply (flat in RESP2, pairs in RESP3) as (score, member) pairs."""
    if not reply:
        return []
    if isinstance(reply[0], (list, tuple)):
        return [(float(text(score)), text(member)) for member, score in reply]
    return [(float(text(reply[i + 1])), text(reply[i])) for i in range(0, len(reply), 2)]


def fields_of(reply: Any) -> dict[str, str]:
    """``HGETALL``'s reply (a dict through valkey-py's callback, or a flat list)."""
    if isinstance(reply, dict):
        return {text(k): text(v) for k, v in reply.items()}
    return pairs(reply) if reply else {}
