"""The order of a worker's full claims (``claiming.ClaimPlan.full``): each starts after the
workflow the last claim took its last run from, so idle workflows between two busy ones
do not give the busy one listed first most of the turns (an audit saw a backlog take 32
starts to another workflow's 4 on a worker serving five idle workflows between them;
~29 after this)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pyrula.workflows.claiming import ClaimPlan


def leases(*workflows: str) -> list[Any]:
    return [SimpleNamespace(run=SimpleNamespace(workflow=name)) for name in workflows]


def test_a_full_claim_starts_after_the_workflow_last_served() -> None:
    plan = ClaimPlan(["quick", "idle1", "idle2", "idle3", "backlog"], full_every=1.0)
    first = plan.full(0.0)
    assert sorted(first) == sorted(plan.names)
    plan.note(leases("backlog"), 0.0)
    assert plan.full(1.0)[0] == "quick"  # after backlog, round to the start
    plan.note(leases("quick"), 1.0)
    order = plan.full(2.0)
    assert order[0] == "idle1" and order.index("backlog") < order.index("quick")
    plan.note(leases("backlog", "quick"), 2.0)  # one claim took from both: quick last
    assert plan.full(3.0)[0] == "idle1"
    assert plan.full(4.0, leave_out=["idle1"])[0] == "idle2"


def test_without_a_served_workflow_the_turn_rotates() -> None:
    plan = ClaimPlan(["a", "b", "c"], full_every=1.0)
    assert [plan.full(float(t))[0] for t in range(4)] == ["b", "c", "a", "b"]
