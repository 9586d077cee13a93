"""Fair, flow-controlled claiming in SQL (the rules are in ``stores/flow.py``).

Per workflow, the ``owners`` table lists every owner that ever had a run of it, with
``last_served`` and ``active`` (set by a trigger whenever one of its runs becomes
queued); one index probe of ``runs_owner_queue`` per active owner finds its head run
(first queued by ``(available_at, seq)``). So a claim costs in proportion to the number
of owners with queued runs, never to the depth of the queue nor to idle owners: a claim
that finds an active owner with no queued run at all clears its flag, in its own
transaction (so no run can become queued meanwhile). The owner with the lowest
:func:`~pyrula.workflows.stores.flow.owner_turn` goes next; after its claim, one more
probe finds its new head.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyrula.workflows.records import Lease, RunRecord
from pyrula.workflows.stores.base import Claimed
from pyrula.workflows.stores.flow import (
    RATE_SKIP_WINDOW,
    Bucket,
    next_token_at,
    owner_turn,
    refill,
    take,
)
from pyrula.workflows.stores.rules import expired_error
from pyrula.workflows.stores.sqlite.sql import to_run
from pyrula.workflows.stores.sqlite.tx import Tx

_CAP = "\x00owner_concurrency"
"""Marks an owner held back by its concurrency cap (never a rate key: keys are text)."""


@dataclass
class _Owner:
    last_served: int | None
    head: sqlite3.Row
    """seq, stamp, available_at and the flow columns of the owner's head run."""
    held: set[str] = field(default_factory=set)
    """Rate keys found out of tokens during this claim."""

    def turn(self) -> int:
        return owner_turn(self.last_served, self.head["stamp"])


def claim(
    tx: Tx,
    worker_id: str,
    workflows: Sequence[str],
    limit: int,
    lease_ttl: float,
    ahead: float = 0.0,
) -> Claimed:
    """Claim up to ``limit`` runs due by ``ahead`` seconds from now, workflows in the
    order given, owners fairly; the runs found expired are ended and reported."""
    leases = Claimed()
    for workflow in dict.fromkeys(workflows):
        if len(leases) >= limit:
            break
        leases += _claim_workflow(
            tx, worker_id, workflow, limit - len(leases), lease_ttl, tx.now + ahead,
            leases.expired,
        )  # fmt: skip
    return leases


def _claim_workflow(
    tx: Tx,
    worker_id: str,
    workflow: str,
    limit: int,
    lease_ttl: float,
    due: float,
    expired: list[RunRecord],
) -> list[Lease]:
    owners: dict[str, _Owner] = {}
    for head in tx.many("due_heads", workflow=workflow, due=due):
        if head["seq"] is not None:
            owners[head["owner"]] = _Owner(head["last_served"], head)
        elif head["idle"]:
            tx.run("set_idle", workflow=workflow, owner=head["owner"])
    counter: int = tx.scalar("claim_counter", workflow=workflow) or 0
    served: dict[str, int] = {}
    leases: list[Lease] = []
    while owners and len(leases) < limit:
        name = min(owners, key=lambda o: (owners[o].turn(), o))
        owner = owners[name]
        if _expired(owner.head, tx.now):
            expired.append(_expire(tx, owner.head["run_id"]))
            _advance(tx, workflow, name, owners, due)
            continue
        held = _held_back(tx, workflow, name, owner.head)
        if held is not None:
            if held is _CAP:
                del owners[name]  # the owner's cap holds all its runs
                continue
            owner.held.add(held)
            _advance(tx, workflow, name, owners, due)
            continue
        counter += 1
        owner.last_served = served[name] = counter
        row = tx.one(
            "claim_run",
            seq=owner.head["seq"],
            worker_id=worker_id,
            now=tx.now,
            expires_at=tx.now + lease_ttl,
        )
        assert row is not None
        run = to_run(row)
        leases.append(Lease(run, run.lease_token, tx.now + lease_ttl))
        _advance(tx, workflow, name, owners, due)
    if served:
        tx.run("set_claim_counter", workflow=workflow, counter=counter)
        for name, last in served.items():
            tx.run("set_last_served", workflow=workflow, owner=name, last_served=last)
    return leases


def _advance(tx: Tx, workflow: str, name: str, owners: dict[str, _Owner], due: float) -> None:
    """Move the owner to its next candidate head run, or out of this claim if none."""
    owner = owners[name]
    head = _next_head(tx, workflow, name, owner.held, due)
    if head is None:
        del owners[name]
    else:
        owner.head = head


def _expired(head: sqlite3.Row, now: float) -> bool:
    """``rules.is_expired`` on a head row."""
    expires_at: float | None = head["expires_at"]
    return expires_at is not None and expires_at <= now


def _expire(tx: Tx, run_id: str) -> RunRecord:
    """End a queued run found past its expiry: cancelled with a RunExpired error, its
    waiters (and a parent waiting for it) woken. It takes no rate token, no turn.
    Returns it as it ended."""
    run = tx.require(run_id)
    return tx.end("expire_run", run, error=expired_error(run))


def _at_cap(tx: Tx, workflow: str, owner: str, cap: int | None) -> bool:
    if cap is None:
        return False
    running: int = tx.scalar("running_count", workflow=workflow, owner=owner, cap=cap)
    return running >= cap


def _bucket(tx: Tx, key: str) -> Bucket | None:
    row = tx.one("get_bucket", key=key)
    return None if row is None else Bucket(row["tokens"], row["updated_at"])


def _next_head(tx: Tx, workflow: str, owner: str, held: set[str], due: float) -> sqlite3.Row | None:
    if not held:
        return tx.one("due_head", workflow=workflow, owner=owner, due=due)
    return tx.one(
        "due_head_skipping",
        workflow=workflow,
        owner=owner,
        due=due,
        held=json.dumps(sorted(held)),
        window=RATE_SKIP_WINDOW,
    )


def _held_back(tx: Tx, workflow: str, owner: str, head: sqlite3.Row) -> str | None:
    """What refuses the head run a claim now: ``_CAP``, its rate key, or None (then its
    rate token is taken). The bucket is written only when a token is taken: a refill
    alone is implied by the time, and writing it would wake every other process's
    waiters for nothing."""
    if _at_cap(tx, workflow, owner, head["owner_concurrency"]):
        return _CAP
    key, per_second = head["rate_key"], head["rate_per_second"]
    if key is not None and per_second:
        taken, bucket, _ = take(_bucket(tx, key), tx.now, per_second, head["rate_burst"])
        if not taken:
            return str(key)
        tx.run("put_bucket", key=key, tokens=bucket.tokens, updated_at=bucket.updated_at)
    return None


def next_due(tx: Tx, workflows: Sequence[str]) -> float | None:
    """The earliest time after now at which a run of ``workflows`` becomes due.

    Per owner, two index probes: its first run not due yet counts from its
    ``available_at``; its first due run, if rate-limited, from its bucket's next token.
    Runs of an owner at its concurrency cap are left out (an ending run wakes claimers).
    """
    times: list[float] = []
    for workflow in dict.fromkeys(workflows):
        wake = tx.scalar("next_wake", workflow=workflow, now=tx.now)
        if wake is not None:
            times.append(wake)
        for row in tx.many("owner_queues", workflow=workflow, now=tx.now):
            owner = row["owner"]
            later = row["later_at"]
            if later is not None and not _at_cap(tx, workflow, owner, row["later_cap"]):
                times.append(later)
            per_second = row["rate_per_second"]
            if row["due_at"] is None or not per_second:
                continue
            if not _at_cap(tx, workflow, owner, row["due_cap"]):
                bucket = refill(_bucket(tx, row["rate_key"]), tx.now, per_second, row["rate_burst"])
                times.append(max(row["due_at"], next_token_at(bucket, per_second)))
    return min((t for t in times if t > tx.now), default=None)
