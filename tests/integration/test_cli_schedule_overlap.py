"""``pyrula schedules create --overlap``, and the policy and last run in ``list``, ``show``
and their ``--json``, in-process (CliRunner) on a real SQLite store file."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from pyrula.workflows import SqliteStore
from pyrula.workflows.records import NewRun
from tests.integration.cli_checks import assert_one_error_line, invoke, ok, ok_json


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pyrula.db'}"


def fire_next_slot(url: str, schedule_id: str) -> str:
    """Fire the schedule's next slot as a worker would; the run's id."""

    async def fire() -> str:
        store = SqliteStore(url.removeprefix("sqlite:///"))
        await store.open()
        try:
            record = await store.get_schedule(schedule_id)
            assert record is not None
            slot = record.next_fire_at
            run = NewRun(
                run_id=f"run-{slot:.0f}",
                workflow=record.workflow,
                params=record.params,
                idempotency_key=f"schedule:{schedule_id}:{slot:.3f}",
            )
            fired = await store.fire_schedule(schedule_id, slot, slot, slot + 60, run)
            assert fired is not None
            return fired.run_id
        finally:
            await store.close()

    return asyncio.run(fire())


def detail(text: str) -> dict[str, str]:
    """``schedules show``'s label/value lines (two spaces or more apart), in order."""
    pairs = [re.match(r"^(\S.*?) {2,}(.*)$", line) for line in text.splitlines()]
    return {m.group(1): m.group(2) for m in pairs if m is not None}


def test_create_with_overlap_skip_then_list_and_show(url: str) -> None:
    line = ok("schedules", "create", "clis_tick", "--every", "60", "--id", "sk",
              "--overlap", "skip", "--store", url).stdout.strip()  # fmt: skip
    assert line.startswith("created schedule sk: clis_tick, every 60s, overlap skip, next fire")
    ok("schedules", "create", "clis_tick", "--every", "60", "--id", "all", "--store", url)

    table = ok("schedules", "list", "--store", url).stdout.splitlines()
    assert table[0].split() == [
        "SCHEDULE", "ID", "WORKFLOW", "TIMING", "TZ", "STATE", "OVERLAP", "NEXT", "FIRE",
        "LAST", "FIRE",
    ]  # fmt: skip
    assert table[1].split()[:7] == ["all", "clis_tick", "every", "60s", "UTC", "active",
                                    "allow_all"]  # fmt: skip
    assert table[2].split()[:7] == ["sk", "clis_tick", "every", "60s", "UTC", "active", "skip"]
    listed = ok_json("schedules", "list", "--store", url)["schedules"]
    assert [(s["overlap"], s["last_run_id"]) for s in listed] == [
        ("allow_all", None),
        ("skip", None),
    ]

    shown = detail(ok("schedules", "show", "sk", "--store", url).stdout)
    assert list(shown) == [
        "Schedule", "Workflow", "Timing", "Timezone", "Owner", "State", "Overlap",
        "Next fire", "Last fire", "Last run", "Params", "Created", "Updated",
    ]  # fmt: skip
    assert (shown["Schedule"], shown["Timing"], shown["Overlap"]) == ("sk", "every 60s", "skip")
    assert (shown["Last fire"], shown["Last run"], shown["Params"]) == ("-", "-", "{}")

    run_id = fire_next_slot(url, "sk")
    shown = detail(ok("schedules", "show", "sk", "--store", url).stdout)
    assert shown["Last run"] == run_id and shown["Last fire"] != "-"
    doc = ok_json("schedules", "show", "sk", "--store", url)["schedule"]
    assert (doc["schedule_id"], doc["overlap"], doc["last_run_id"]) == ("sk", "skip", run_id)
    assert doc["last_fire_at"] is not None and doc["params"] == {}

    # A replace keeps the last run, and takes the new policy.
    replaced = ok_json("schedules", "create", "clis_tick", "--every", "30", "--id", "sk",
                       "--replace", "--store", url)["schedule"]  # fmt: skip
    assert (replaced["overlap"], replaced["last_run_id"]) == ("allow_all", run_id)
    created = ok_json("schedules", "create", "clis_tick", "--every", "60", "--id", "new",
                      "--overlap", "skip", "--store", url)["schedule"]  # fmt: skip
    assert (created["overlap"], created["last_run_id"]) == ("skip", None)


def test_show_an_unknown_schedule_exits_1(url: str) -> None:
    assert_one_error_line(invoke("schedules", "show", "nope", "--store", url), 1,
                          "no schedule with id 'nope'")  # fmt: skip


def test_a_bad_overlap_is_a_usage_error_and_stores_nothing(url: str) -> None:
    for value in ("queue", "SKIP", ""):
        result = invoke("schedules", "create", "clis_tick", "--every", "60", "--overlap", value,
                        "--store", url)  # fmt: skip
        assert_one_error_line(result, 2, f"unknown overlap policy {value!r}",
                              "use one of 'allow_all', 'skip'")  # fmt: skip
    assert ok_json("schedules", "list", "--store", url) == {"schedules": []}
    help_text = " ".join(ok("schedules", "create", "--help").stdout.split())
    assert "--overlap allow_all|skip" in help_text and "[default: allow_all]" in help_text
