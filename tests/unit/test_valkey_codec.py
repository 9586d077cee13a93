"""Reading runs back from the Lua's packed replies (stores/valkey/codec.py): JSON with
every value a string, and ``to_run`` builds the same RunRecord its ``__init__`` would,
field for field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pyrula.workflows.records import DEFAULT_OWNER, NO_FLOW, FlowControl, RunRecord, RunStatus
from pyrula.workflows.stores.valkey.codec import RUN_FIELDS, to_run, unpack_fields


def pack(fields: dict[str, str]) -> str:
    """What lua/common.lua's pack_run writes (cjson, which escapes ``/`` too)."""
    return json.dumps(fields, ensure_ascii=False).replace("/", "\\/")


def pack_flat(fields: dict[str, str]) -> str:
    """What lua/common.lua's pack_flat writes: a JSON array ``[field, value, ...]``."""
    return json.dumps([x for kv in fields.items() for x in kv], ensure_ascii=False)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"a": ""},
        {"wf": "x:y", "p": '{"args":[1,"2:3"]}', "er": "12:34:"},
        {"wf": "tâche", "p": '{"s":"日本語", "n": 123456789012345678901234567890}', "rs": "é"},
        {"p": '{"a": [], "b": {}, "c": "\\u0000\\n/"}', "ws": ""},
    ],
)
def test_unpack_reads_back_what_the_lua_packs(fields: dict[str, str]) -> None:
    for packed in (pack(fields), pack_flat(fields)):
        assert unpack_fields(packed) == fields
        assert unpack_fields(packed.encode()) == fields


@pytest.mark.parametrize("packed", ["", "[", '["wf"]', '["wf", "a", "x"]', "3", "x"])
def test_a_malformed_reply_is_an_error(packed: str) -> None:
    with pytest.raises(ValueError):
        unpack_fields(packed)


def test_to_run_builds_the_record_init_would() -> None:
    fields = {
        "wf": "w", "p": "{}", "st": "running", "ow": "team", "ik": "k", "ca": "1.5",
        "aa": "2.25", "ua": "3", "sa": "4", "wk": "worker", "tk": "7", "le": "9.5",
        "cr": "1", "rc": "2", "cl": "3", "pa": "parent", "wa": "11", "ws": "go",
        "wc": "child", "ps": "PROGRESS", "pi": "{}", "ex": "12", "fp": "4", "rs": "1",
        "er": "e", "fa": "5",
    }  # fmt: skip
    run = to_run("r1", pack(fields))
    expected = RunRecord(
        run_id="r1", workflow="w", params="{}", status=RunStatus.RUNNING, owner="team",
        idempotency_key="k", created_at=1.5, available_at=2.25, updated_at=3.0,
        started_at=4.0, finished_at=5.0, result="1", error="e", worker_id="worker",
        lease_token=7, lease_expires_at=9.5, cancel_requested=True, recoveries=2, claims=3,
        parent_run_id="parent", wake_at=11.0, wait_signal="go", wait_child="child",
        flow=NO_FLOW, expires_at=12.0, progress_state="PROGRESS", progress_info="{}",
        failed_position=4,
    )  # fmt: skip
    assert run == expected and vars(run) == vars(expected)
    # built without __init__ (codec.built_run): every field, in the declared order
    assert list(vars(run)) == list(RUN_FIELDS) and repr(run) == repr(expected)
    assert hash(run.flow) == hash(expected.flow) and run.is_terminal is False
    assert dataclasses.replace(run, claims=4).claims == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.claims = 5  # type: ignore[misc]

    # Defaults, a lease expiry kept after the run ended, and flow control.
    done = to_run(
        "r2",
        {"wf": "w", "p": "{}", "st": "completed", "ca": "1", "aa": "1", "ua": "1", "le": "9",
         "fk": "rk", "fr": "2.5", "fb": "3"},
    )  # fmt: skip
    assert done.status is RunStatus.COMPLETED and done.owner == DEFAULT_OWNER
    assert done.lease_expires_at is None and done.lease_token == 0
    assert done.flow == FlowControl(rate_key="rk", rate_per_second=2.5, rate_burst=3.0)
    assert done == RunRecord(**{f.name: getattr(done, f.name) for f in dataclasses.fields(done)})
