"""LeaseWatch: what the shard-lease fault test (test_shard_lease_faults.py) records of a
real valkey-server while worker processes hold, lose and take shard leases: the lease keys
sampled with the server's ``TIME``, and every lease tick and claim read from ``MONITOR``."""

from __future__ import annotations

import bisect
import json
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import valkey

SHARDS = 8
SAMPLE_EVERY = 0.02
ARG = re.compile(rb'"((?:[^"\\]|\\.)*)"')  # one argument of a MONITOR line


@dataclass(frozen=True)
class Sample:
    """The lease hash at server time ``t``: shard -> (holder, expires)."""

    t: float
    holders: dict[int, tuple[str, float]]

    def owner(self, shard: int) -> str | None:
        """The shard's holder if its lease is valid at ``t``."""
        held = self.holders.get(shard)
        return held[0] if held is not None and held[1] > self.t else None

    def held_by(self, worker: str) -> set[int]:
        return {s for s in range(SHARDS) if self.owner(s) == worker}


@dataclass(frozen=True)
class Call:
    """A lease_tick, lease_release or claim_due as MONITOR saw it (server time)."""

    t: float
    name: str
    worker: str
    own: frozenset[int] = frozenset()


@dataclass
class LeaseWatch:
    """Samples a namespace's lease keys and reads MONITOR, each on a thread of its own."""

    port: int
    namespace: str
    samples: list[Sample] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.h = f"{self.namespace}:{{{self.namespace}:leases}}:h"
        self._stop, self._monitoring = threading.Event(), threading.Event()
        jobs = (self._sample, self._monitor)
        self._threads = [threading.Thread(target=job, daemon=True) for job in jobs]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        assert self._monitoring.wait(5), "MONITOR did not start"

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)

    def latest(self) -> Sample:
        return self.samples[-1]

    def save(self, path: Path) -> None:
        """The calls and the samples, as JSON (artifacts)."""
        calls = [vars(c) | {"own": sorted(c.own)} for c in self.calls]
        path.write_text(json.dumps({"calls": calls, "samples": [vars(s) for s in self.samples]}))

    def _sample(self) -> None:
        client = valkey.Valkey(port=self.port)
        try:
            while not self._stop.is_set():
                pipe = client.pipeline(transaction=True)
                pipe.time()
                pipe.hgetall(self.h)
                (sec, usec), flat = pipe.execute()
                holders = {}
                for shard, value in flat.items():
                    holder, _, until = value.decode().rpartition("|")
                    holders[int(shard)] = (holder, float(until))
                self.samples.append(Sample(sec + usec / 1e6, holders))
                time.sleep(SAMPLE_EVERY)
        finally:
            client.close()

    def _monitor(self) -> None:
        client = valkey.Valkey(port=self.port)
        conn = client.connection_pool.get_connection("MONITOR")
        try:
            conn.send_command("MONITOR")
            conn.read_response()
            self._monitoring.set()
            while not self._stop.is_set():
                if conn.can_read(timeout=0.1):
                    self._note(conn.read_response())
        finally:
            conn.disconnect()
            client.close()

    def _note(self, raw: bytes) -> None:
        if b'"FCALL"' not in raw or b" lua]" in raw:
            return
        stamp, _, rest = raw.partition(b" ")
        # FCALL, name, numkeys, key, then ARGV[1] (the clock): ARGV[i] is args[3 + i]
        args = [a.decode(errors="replace") for a in ARG.findall(rest)]
        if len(args) < 7 or not args[3].startswith(self.namespace + ":"):
            return
        t, name = float(stamp), args[1]
        for kind in ("lease_tick", "lease_release"):
            if name.endswith("_" + kind):
                self.calls.append(Call(t, kind, args[5]))
        if name.endswith("_claim_due"):  # ARGV[7] n, then n triples, then its own shards
            own = frozenset(int(s) for s in args[11 + 3 * int(args[10]) :])
            self.calls.append(Call(t, "claim_due", args[6], own))

    # -- analysis ----------------------------------------------------------------------
    def around(self, t: float) -> tuple[Sample, Sample]:
        """The last sample at or before ``t`` and the first after it."""
        i = bisect.bisect_right([s.t for s in self.samples], t)
        return self.samples[max(0, i - 1)], self.samples[min(i, len(self.samples) - 1)]

    def unowned_gaps(self, since: float) -> list[float]:
        """Each stretch a shard had no valid holder: from the last sample that had one to
        the next that has one (an upper bound, by up to two sampling periods)."""
        gaps = []
        for shard in range(SHARDS):
            owned_at, in_gap = since, False
            for sample in (s for s in self.samples if s.t >= since):
                if sample.owner(shard) is None:
                    in_gap = True
                    continue
                if in_gap:
                    gaps.append(sample.t - owned_at)
                owned_at, in_gap = sample.t, False
            if in_gap:
                gaps.append(self.samples[-1].t - owned_at)
        return gaps

    def handover(self, shards: set[int], to: set[str], since: float) -> dict[int, float]:
        """Per shard, how long after ``since`` a worker of ``to`` first held it validly."""
        out = dict.fromkeys(shards, math.inf)
        for sample in (s for s in self.samples if s.t >= since):
            for shard in shards:
                if out[shard] == math.inf and sample.owner(shard) in to:
                    out[shard] = sample.t - since
        return out

    def overlaps(self) -> list[str]:
        """Shards taken from a holder whose lease was still valid and who made no lease
        call in between (so did not give the shard back): two valid owners at once."""
        found = []
        for a, b in zip(self.samples, self.samples[1:], strict=False):
            for shard in range(SHARDS):
                x, y = a.owner(shard), b.owner(shard)
                if x is None or y is None or x == y or a.holders[shard][1] <= b.t:
                    continue
                if not any(
                    c.worker == x and c.name != "claim_due" and a.t - 0.005 <= c.t <= b.t + 0.005
                    for c in self.calls
                ):
                    found.append(f"shard {shard}: {x} (valid) -> {y} between {a.t} and {b.t}")
        return found

    def stale_claims(self) -> tuple[list[tuple[Call, set[int]]], list[tuple[Call, set[int]]]]:
        """Claims naming as the claimer's own a shard it held at neither the sample before
        nor the one after: (lapsed: it never held it, or its last lease on it had expired
        by the claim; given back: that lease was valid, so a rebalance tick gave it back
        and its reply was still on its way, a race of one round trip)."""
        lapsed, given_back = [], []
        times = [s.t for s in self.samples]
        for call in (c for c in self.calls if c.name == "claim_due" and c.own):
            a, b = self.around(call.t)
            stale = {s for s in call.own if call.worker not in (a.owner(s), b.owner(s))}
            valid = set()
            for shard in stale:
                for sample in reversed(self.samples[: bisect.bisect_right(times, call.t)]):
                    if sample.owner(shard) == call.worker:
                        if sample.holders[shard][1] > call.t:
                            valid.add(shard)
                        break
            if valid:
                given_back.append((call, valid))
            if stale - valid:
                lapsed.append((call, stale - valid))
        return lapsed, given_back
