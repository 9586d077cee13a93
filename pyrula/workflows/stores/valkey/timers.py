"""ValkeyStore's timers: waking sleeping and waiting runs, and when work is next due.

Both start from the hints (``ns:{ns:timers}:d``: shard -> its earliest timer, and each
workflow's ``d``/``t`` zsets), so an idle namespace costs one read, not one per shard.
``next_due_at`` reads every workflow's hints in one round trip. A future timer hint is
exact; the shards whose hint is due but whose runs were not claimed, and the shard of the
earliest future queued-run hint (a lower bound), are asked for the exact answer: future
queued runs whose owner is under its concurrency cap, owner heads waiting for a rate
token, future timers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.stores.flow import next_token_at, refill
from pyrula.workflows.stores.valkey.codec import text
from pyrula.workflows.stores.valkey.connection import Call
from pyrula.workflows.stores.valkey.core import ValkeyCore, flat_text, parse_bucket, server_time


class TimerOps(ValkeyCore):
    """fire_timers and next_due_at."""

    async def fire_timers(self, limit: int) -> int:
        if limit <= 0:
            return 0
        await self._ensure_open()
        due = flat_text(await self._server.call("timer_due", self._keys.timer_hint))
        fired = 0
        for shard, _ in sorted(scored(due), key=lambda item: item[1]):
            if fired >= limit:
                break
            fired += int(text(await self._shard("fire", shard, str(limit - fired))))
        return fired

    async def next_due_at(self, workflows: Sequence[str]) -> float | None:
        names = list(dict.fromkeys(workflows))
        if not names:
            return None
        await self._ensure_open()
        reads = [
            ("ZRANGE", self._keys.hint(wf) + suffix, 0, -1, "WITHSCORES")
            for wf in names
            for suffix in ("d", "t")
        ]
        # One round trip for all, with the server's clock (unless the store has its own).
        clock = [] if self._clock is not None else [("TIME",)]
        replies = iter(await self._server.commands([*clock, *reads]))
        now = self._clock() if self._clock is not None else server_time(next(replies))
        times: list[float] = []  # exact
        later: list[tuple[float, int, str]] = []  # future queued-run hints: lower bounds
        # shard -> the workflows to ask it about: each shard is asked about those only (a
        # worker serving 20 workflows would otherwise have every probed shard look at all
        # 20, a few commands each, holding the server for milliseconds).
        probe: dict[int, list[str]] = {}
        for wf in names:
            for suffix in ("d", "t"):
                for shard, score in scored(next(replies)):
                    if score <= now:  # due, yet not claimed: the shard tells what is next
                        _ask(probe, shard, wf)
                    elif suffix == "t":
                        times.append(score)  # a future timer's time is exact
                    else:
                        later.append((score, shard, wf))
        # A future hint is when the shard's first queued run comes due, at the earliest
        # (flow control may hold it longer): shards are asked in the order of their hints,
        # only while their hint is before the best exact time found (1, then 2, 4, ...
        # per call), so one call usually settles it however many shards hold delayed runs.
        later.sort()
        best, taken, batch = min(times, default=math.inf), 0, 1
        while taken < len(later) and later[taken][0] < best:
            for hint, shard, wf in later[taken : taken + batch]:
                if hint < best:
                    _ask(probe, shard, wf)
            taken, batch = taken + batch, 2 * batch
            best = min(best, await self._ask_shards(probe, now, times))
            probe = {}
        if probe:
            await self._ask_shards(probe, now, times)
        return min((t for t in times if t > now), default=None)

    async def _ask_shards(
        self, probe: dict[int, list[str]], now: float, times: list[float]
    ) -> float:
        """Ask the shards of ``probe`` what of its workflows comes due next, appending the
        answers to ``times``; the earliest future one (inf: none)."""
        plan = sorted(probe.items())
        calls = [(s, self._shard_call("next_due", s, *wfs)) for s, wfs in plan]
        found = await self._probe_due(calls, [wfs for _, wfs in plan], now)
        times += found
        return min((t for t in found if t > now), default=math.inf)

    async def _probe_due(
        self, calls: list[tuple[int, Call]], asked: list[list[str]], now: float
    ) -> list[float]:
        times: list[float] = []
        capped: list[tuple[float, str, str, int]] = []
        heads: list[tuple[float, str, str, str, float, float, int | None]] = []
        for reply, names in zip(await self._shards(calls), asked, strict=False):
            if isinstance(reply, BaseException):
                raise reply
            for wf, (future, timer, rate_heads, caps) in zip(names, flat_text(reply), strict=False):
                times += [float(x) for x in (future, timer) if x]
                for i in range(0, len(caps), 3):
                    capped.append((float(caps[i]), wf, caps[i + 1], int(caps[i + 2])))
                for i in range(0, len(rate_heads), 6):
                    at, owner, key, per, burst, cap = rate_heads[i : i + 6]
                    heads.append(
                        (
                            float(at),
                            wf,
                            owner,
                            key,
                            float(per),
                            float(burst),
                            int(cap) if cap else None,
                        )
                    )
        if not capped and not heads:
            return times
        groups = sorted(
            {(wf, owner) for _, wf, owner, _ in capped}
            | {(h[1], h[2]) for h in heads if h[6] is not None}
        )
        rate_keys = sorted({h[3] for h in heads})
        counts, buckets = flat_text(
            await self._server.call(
                "flow_state", self._keys.flow, str(len(groups)),
                *[self._keys.concurrency(wf, owner) for wf, owner in groups], *rate_keys,
            )
        )  # fmt: skip
        running = {g: int(c) for g, c in zip(groups, counts, strict=False)}
        bucket = dict(zip(rate_keys, buckets, strict=False))
        for at, wf, owner, cap in capped:
            if running.get((wf, owner), 0) < cap:
                times.append(at)
        for at, wf, owner, key, per, burst, cap_ in heads:
            if cap_ is not None and running.get((wf, owner), 0) >= cap_:
                continue
            state = refill(parse_bucket(bucket.get(key, "")), now, per, burst)
            times.append(max(at, next_token_at(state, per)))
        return times


def scored(flat: Any) -> list[tuple[int, float]]:
    """A ZRANGE ... WITHSCORES reply as (shard, score) pairs."""
    if flat and isinstance(flat[0], (list, tuple)):
        return [(int(text(m)), float(s)) for m, s in flat]
    return [(int(text(flat[i])), float(text(flat[i + 1]))) for i in range(0, len(flat), 2)]


def _ask(probe: dict[int, list[str]], shard: int, wf: str) -> None:
    asked = probe.setdefault(shard, [])
    if not asked or asked[-1] != wf:
        asked.append(wf)
