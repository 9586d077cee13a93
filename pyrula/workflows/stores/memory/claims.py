"""Fair, flow-controlled claiming over MemoryStore's state (see ``stores/flow.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pyrula.workflows.records import Lease, RunRecord, RunStatus
from pyrula.workflows.stores.base import Claimed
from pyrula.workflows.stores.flow import RATE_SKIP_WINDOW, next_token_at, owner_turn, refill, take
from pyrula.workflows.stores.memory.state import MemoryState
from pyrula.workflows.stores.rules import expired_error, is_expired


def _queues(state: MemoryState, workflow: str, due: float) -> dict[str, list[RunRecord]]:
    """Queued runs of ``workflow`` available by ``due``, per owner, each list in FIFO order."""
    per_owner: dict[str, list[RunRecord]] = {}
    for run in state.runs.values():
        if run.workflow == workflow and run.status is RunStatus.QUEUED and run.available_at <= due:
            per_owner.setdefault(run.owner, []).append(run)
    for runs in per_owner.values():
        runs.sort(key=lambda r: (r.available_at, state.order[r.run_id]))
    return per_owner


def _running(state: MemoryState, workflow: str, owner: str) -> int:
    return sum(
        1
        for run in state.runs.values()
        if run.workflow == workflow and run.owner == owner and run.status is RunStatus.RUNNING
    )


_CAP = "\x00owner_concurrency"
"""Marks an owner held back by its concurrency cap (never a rate key: keys are text)."""


def _held_back(state: MemoryState, run: RunRecord, now: float) -> str | None:
    """What refuses the run a claim now: ``_CAP``, its rate key, or None (then its rate
    token is taken)."""
    flow = run.flow
    cap = flow.owner_concurrency
    if cap is not None and _running(state, run.workflow, run.owner) >= cap:
        return _CAP
    if flow.rate_key is not None and flow.rate_per_second:
        taken, bucket, _ = take(
            state.buckets.get(flow.rate_key), now, flow.rate_per_second, flow.rate_burst
        )
        if not taken:
            return flow.rate_key
        state.buckets[flow.rate_key] = bucket
    return None


def _head(runs: list[RunRecord], held: set[str]) -> int | None:
    """Index of the owner's first run not held by an exhausted rate key, within the
    window; None when there is none."""
    if not held:
        return 0 if runs else None
    for index, run in enumerate(runs[:RATE_SKIP_WINDOW]):
        if run.flow.rate_key is None or run.flow.rate_key not in held:
            return index
    return None


def claim(
    state: MemoryState,
    worker_id: str,
    workflows: Sequence[str],
    limit: int,
    lease_ttl: float,
    ahead: float = 0.0,
) -> Claimed:
    now = state.clock()
    leases = Claimed()
    for workflow in dict.fromkeys(workflows):
        queues = _queues(state, workflow, now + ahead)
        heads = dict.fromkeys(queues, 0)
        held: dict[str, set[str]] = {owner: set() for owner in queues}
        while heads and len(leases) < limit:
            owner = min(
                heads,
                key=lambda o: (
                    owner_turn(
                        state.served.get((workflow, o)),
                        state.stamps[queues[o][heads[o]].run_id],
                    ),
                    o,
                ),
            )
            run = queues[owner][heads[owner]]
            expired = is_expired(run, now)
            reason = None if expired else _held_back(state, run, now)
            if reason == _CAP:
                del heads[owner]  # the owner's cap holds all its runs
                continue
            if reason is not None:
                held[owner].add(reason)
            else:
                queues[owner].pop(heads[owner])
            index = _head(queues[owner], held[owner])
            if index is None:
                del heads[owner]
            else:
                heads[owner] = index
            if expired:
                leases.expired.append(state.end(run, RunStatus.CANCELLED, error=expired_error(run)))
            if expired or reason is not None:
                continue
            counter = state.claim_counter.get(workflow, 0) + 1
            state.claim_counter[workflow] = counter
            state.served[(workflow, owner)] = counter
            token = state.next_token()
            claimed = state.save(
                replace(
                    run,
                    status=RunStatus.RUNNING,
                    worker_id=worker_id,
                    lease_token=token,
                    lease_expires_at=now + lease_ttl,
                    claims=run.claims + 1,
                    updated_at=now,
                    # A run claimed ahead of its time starts at it (see claim_runs).
                    started_at=run.started_at
                    if run.started_at is not None
                    else max(now, run.available_at),
                    expires_at=None,  # expiry applies only to a run that never started
                )
            )
            leases.append(Lease(run=claimed, token=token, expires_at=now + lease_ttl))
    return leases


def next_due(state: MemoryState, workflows: Sequence[str]) -> float | None:
    names = set(workflows)
    now = state.clock()
    times: list[float] = []
    for run in state.runs.values():
        if run.workflow not in names:
            continue
        if run.status is RunStatus.QUEUED:
            cap = run.flow.owner_concurrency
            if cap is not None and _running(state, run.workflow, run.owner) >= cap:
                continue  # the finish that frees a slot wakes the claimers
            when = run.available_at
            key = run.flow.rate_key
            if when <= now and key is not None and run.flow.rate_per_second:
                bucket = refill(
                    state.buckets.get(key), now, run.flow.rate_per_second, run.flow.rate_burst
                )
                when = max(when, next_token_at(bucket, run.flow.rate_per_second))
            times.append(when)
        elif run.status in (RunStatus.SLEEPING, RunStatus.WAITING) and run.wake_at is not None:
            times.append(run.wake_at)
    return min((t for t in times if t > now), default=None)
