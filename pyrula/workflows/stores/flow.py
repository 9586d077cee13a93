"""Fair claiming and flow control: the rules every store applies at claim time.

Fairness is deficit round robin with a quantum of one run: per workflow, a counter
goes up on every claim, and each owner remembers the counter value of its last claim
(``last_served``). An owner's turn is ``max(last_served, stamp of its head run)``, where
a run's stamp is the counter value when it last became queued. The owner with the
lowest turn goes next. So a backlogged owner alternates with the others (its turn is
its last claim), an idle owner banks no credit (its new head run is stamped *now*),
and a newly active owner lines up behind those already waiting instead of jumping ahead.
Within an owner runs go FIFO by ``(available_at, submission)``. A run whose rate key is
out of tokens keeps its place while runs of other keys behind it go by, looking no further
than the owner's first ``RATE_SKIP_WINDOW`` due runs; an owner at its concurrency cap is
skipped whole.
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_SKIP_WINDOW = 64
"""How far past rate-limited runs a claim looks for an owner's next claimable run."""

CLAIM_SHARE = 8
"""Sharded stores: the fewest runs a claim asks of each shard it visits (while it still
wants that many). A claim of 50 visits ~7 shards instead of 50, so a worker's batch costs
a few shard passes; a quiet tenant on another shard waits a few more claims for its turn
(one pass over the shards is ``shard_count / CLAIM_SHARE`` claims of 50)."""


def owner_turn(last_served: int | None, head_stamp: int) -> int:
    """When an owner's next claim is due; lower goes first."""
    return head_stamp if last_served is None else max(last_served, head_stamp)


@dataclass(frozen=True)
class Bucket:
    """A token bucket's state: ``tokens`` as of ``updated_at``."""

    tokens: float
    updated_at: float


def refill(bucket: Bucket | None, now: float, per_second: float, burst: float) -> Bucket:
    """The bucket as of ``now``; a new bucket starts full."""
    if bucket is None:
        return Bucket(burst, now)
    elapsed = max(0.0, now - bucket.updated_at)
    return Bucket(min(burst, bucket.tokens + elapsed * per_second), now)


TOKEN_SLACK = 1e-6
"""Seconds. A token that accrues within this long is taken now: epoch-second floats are
exact only to about 2.4e-7 s, so a claim made exactly at :func:`next_token_at` could
otherwise find 0.999999 tokens and be refused, leaving the run to wait a poll interval."""


def take(
    bucket: Bucket | None, now: float, per_second: float, burst: float
) -> tuple[bool, Bucket, float]:
    """Try to take one token: (taken, new state, time the next token is available)."""
    current = refill(bucket, now, per_second, burst)
    if current.tokens >= 1.0 - TOKEN_SLACK * per_second:
        after = Bucket(max(0.0, current.tokens - 1.0), now)
        return True, after, next_token_at(after, per_second)
    return False, current, next_token_at(current, per_second)


def next_token_at(bucket: Bucket, per_second: float) -> float:
    """When the bucket next holds at least one token."""
    if bucket.tokens >= 1.0:
        return bucket.updated_at
    return bucket.updated_at + (1.0 - bucket.tokens) / per_second
