"""``render.run_dict``: every field of a run record, as ``pyrula runs list|show --json``
and the dashboard print it, flow control and waits included (an audit found them
missing: no CLI view said whether a queued run carries limits or why it is held)."""

from __future__ import annotations

from pyrula.cli.render import run_dict
from pyrula.workflows.records import NO_FLOW, FlowControl, RunRecord, RunStatus
from pyrula.workflows.stores.valkey.codec import RUN_FIELDS


def record(**changes: object) -> RunRecord:
    values: dict[str, object] = {
        "run_id": "r1", "workflow": "wf", "params": "{}", "status": RunStatus.QUEUED,
        "owner": "acme", "idempotency_key": None, "created_at": 1_700_000_000.0,
        "available_at": 1_700_000_000.0, "updated_at": 1_700_000_000.0,
    }  # fmt: skip
    values.update(changes)
    return RunRecord(**values)  # type: ignore[arg-type]


def test_every_field_of_the_record_is_printed() -> None:
    printed = run_dict(record(), 1_700_000_001.0)
    assert set(RUN_FIELDS) <= set(printed), set(RUN_FIELDS) - set(printed)


def test_flow_control_waits_and_expiry_are_printed() -> None:
    flow = FlowControl(rate_key="api:acme", rate_per_second=5.0, owner_concurrency=1)
    run = record(
        flow=flow, expires_at=1_700_000_060.0, parent_run_id="p1", wake_at=1_700_000_030.0,
        wait_signal="go", progress_info='{"done": 3}', failed_position=2,
    )  # fmt: skip
    printed = run_dict(run, 1_700_000_001.0)
    assert printed["flow"] == {
        "rate_key": "api:acme", "rate_per_second": 5.0, "rate_burst": 1.0,
        "owner_concurrency": 1,
    }  # fmt: skip
    assert printed["expires_at"] == "2023-11-14T22:14:20.000Z"
    assert printed["wake_at"] == "2023-11-14T22:13:50.000Z"
    assert (printed["parent_run_id"], printed["wait_signal"]) == ("p1", "go")
    assert printed["progress_info"] == {"done": 3} and printed["failed_position"] == 2
    assert run_dict(record(flow=NO_FLOW), 0.0)["flow"] is None
