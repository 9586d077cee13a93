"""``pyrula schedules ...``, ``pyrula runs signal`` and ``runs show`` of the journal
entries of waits, in-process (CliRunner) on a real SQLite store file.

Each CLI invocation opens and closes the file, as separate commands from a shell would;
what one command wrote, the next reads. The last test has a real worker (in a thread)
fire a schedule the CLI created.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import (
    InlineWorkflowRunner,
    ResultTimeout,
    RetryPolicy,
    RunStatus,
    SqliteStore,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.records import ScheduleRecord
from tests.integration.cli_checks import assert_one_error_line, invoke, ok, ok_json

FIRE_LIMIT = 30.0
"""Longest the worker test waits for a 1-second schedule to fire: a bound, not a timing."""


@workflow(name="clis_approval")
async def clis_approval(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    decision = await ctx.wait_for_signal("approve")
    return {"order": order, "decision": decision}


@workflow(name="clis_tick")
async def clis_tick(ctx: WorkflowContext, n: int = 0) -> int:
    return int(await ctx.step("add", lambda: n + 1))


def _unreachable() -> None:
    raise ConnectionError("partner down")


@workflow(name="clis_backoff")
async def clis_backoff(ctx: WorkflowContext) -> None:
    await ctx.sleep(0, name="nap")
    await ctx.step(
        "call", _unreachable, retry=RetryPolicy(max_attempts=2, initial_backoff=600, jitter=0)
    )


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pyrula.db'}"


def stored(url: str) -> list[ScheduleRecord]:
    """The schedules in the file, read through the store's own blocking API."""
    store = SqliteStore(url.removeprefix("sqlite:///"))
    try:
        return store.schedule_list()
    finally:
        asyncio.run(store.close())


# -- create and list ---------------------------------------------------------------------
def test_create_cron_schedule_is_stored_and_listed(url: str) -> None:
    result = ok(
        "schedules", "create", "clis_tick", "--cron", "0 2 * * *", "--params", '{"n": 4}',
        "--id", "nightly", "--timezone", "Europe/Paris", "--store", url,
    )  # fmt: skip
    line = result.stdout.strip()
    assert line.startswith("created schedule nightly: clis_tick, cron 0 2 * * * (Europe/Paris)")
    assert "next fire 20" in line

    [record] = stored(url)
    assert (record.schedule_id, record.workflow, record.cron, record.every) == (
        "nightly", "clis_tick", "0 2 * * *", None,
    )  # fmt: skip
    assert (record.timezone, record.enabled, json.loads(record.params)) == (
        "Europe/Paris", True, {"n": 4},
    )  # fmt: skip
    # 02:00 in Paris is 00:00 or 01:00 UTC, depending on the season.
    assert time.gmtime(record.next_fire_at).tm_hour in (0, 1)
    assert time.gmtime(record.next_fire_at).tm_min == 0

    table = ok("schedules", "list", "--store", url).stdout.splitlines()
    assert table[0].split()[:3] == ["SCHEDULE", "ID", "WORKFLOW"]
    assert table[1].split()[:7] == ["nightly", "clis_tick", "cron", "0", "2", "*", "*"]
    assert "Europe/Paris" in table[1] and "active" in table[1]


def test_create_interval_schedule_with_owner_and_json(url: str) -> None:
    before = time.time()
    doc = ok_json("schedules", "create", "clis_tick", "--every", "90", "--owner", "t-1",
                  "--store", url)  # fmt: skip
    schedule = doc["schedule"]
    assert schedule["workflow"] == "clis_tick" and schedule["every_s"] == 90.0
    assert schedule["cron"] is None and schedule["owner"] == "t-1"
    assert schedule["params"] == {} and schedule["enabled"] is True
    assert schedule["last_fire_at"] is None
    assert schedule["schedule_id"].startswith("clis_tick:")  # derived from the definition
    [record] = stored(url)
    assert record.schedule_id == schedule["schedule_id"]
    assert before + 90 <= record.next_fire_at <= time.time() + 90
    assert "every 90s" in ok("schedules", "list", "--store", url).stdout


def test_list_filters_by_workflow_and_says_when_empty(url: str) -> None:
    assert ok("schedules", "list", "--store", url).stdout.strip() == "no schedules"
    assert ok_json("schedules", "list", "--store", url) == {"schedules": []}
    ok("schedules", "create", "clis_tick", "--every", "60", "--id", "b", "--store", url)
    ok("schedules", "create", "other_flow", "--every", "60", "--id", "a", "--store", url)
    ids = [s["schedule_id"] for s in ok_json("schedules", "list", "--store", url)["schedules"]]
    assert ids == ["a", "b"]  # ordered by id
    only = ok_json("schedules", "list", "--workflow", "clis_tick", "--store", url)
    assert [s["schedule_id"] for s in only["schedules"]] == ["b"]


def test_store_url_comes_from_the_environment(url: str) -> None:
    result = CliRunner().invoke(
        cli, ["schedules", "create", "clis_tick", "--every", "5", "--id", "env"],
        env={"PYRULA_STORE_URL": url}, catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [r.schedule_id for r in stored(url)] == ["env"]


def test_create_existing_id_exits_1_and_replace_overwrites(url: str) -> None:
    ok("schedules", "create", "clis_tick", "--every", "60", "--id", "s", "--store", url)
    again = invoke("schedules", "create", "clis_tick", "--every", "30", "--id", "s",
                   "--store", url)  # fmt: skip
    assert_one_error_line(again, 1, "'s' exists already", "--replace")
    assert [r.every for r in stored(url)] == [60.0]

    ok("schedules", "create", "clis_tick", "--every", "30", "--id", "s", "--replace",
       "--params", '{"n": 1}', "--store", url)  # fmt: skip
    [record] = stored(url)
    assert (record.every, json.loads(record.params)) == (30.0, {"n": 1})


# -- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((), "exactly one of --cron EXPR or --every SECONDS"),
        (("--cron", "* * * * *", "--every", "5"), "exactly one of"),
        (("--cron", ""), "empty"),
        (("--cron", "* * * *"), "has 4 fields; expected 5"),
        (("--cron", "* * * * * *"), "has 6 fields"),
        (("--cron", "61 * * * *"), "not valid"),
        (("--cron", "*/0 * * * *"), "a step of 0"),
        (("--cron", "\u0661 * * * *"), "non-ASCII"),
        (("--cron", "0 0 30 2 *"), "never fires"),
        (("--cron", "5-1 * * * *"), "minute range '5-1' starts after it ends; write 5-59,0-1"),
        (("--cron", "0 9 * * fri-mon"), "write fri-sat,sun-mon for a range that wraps"),
        (("--every", "0.5"), "at least one second"),
        (("--every", "5", "--timezone", "Mars/Olympus"), "unknown timezone 'Mars/Olympus'"),
        (("--every", "5", "--params", "{not json"), "--params is not valid JSON"),
        (("--every", "5", "--params", "[1, 2]"), "--params must be a JSON object"),
        (("--every", "5", "--params", '{"x": NaN}'), "NaN is not allowed"),
        (("--every", "5", "--id", " "), "schedule_id must be a non-empty string"),
        (("--every", "5", "--overlap", "queue"), "unknown overlap policy 'queue'; use one of"),
    ],
)
def test_create_bad_input_exits_2_and_stores_nothing(
    url: str, args: tuple[str, ...], needle: str
) -> None:
    result = invoke("schedules", "create", "clis_tick", *args, "--store", url)
    assert_one_error_line(result, 2, needle)
    assert stored(url) == []


def test_unknown_schedule_exits_1(url: str) -> None:
    for command in ("pause", "resume", "delete"):
        result = invoke("schedules", command, "nope", "--store", url)
        assert_one_error_line(result, 1, "no schedule with id 'nope'")


def test_unreachable_store_exits_1(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}"
    for args in (("list",), ("create", "clis_tick", "--every", "5"), ("pause", "x")):
        result = invoke("schedules", *args, "--store", missing)
        assert_one_error_line(result, 1, "cannot open the SQLite database")
    assert_one_error_line(invoke("schedules", "list", "--store", "ftp://x"), 1, "ftp://x")


# -- pause, resume, delete -------------------------------------------------------------
def test_pause_resume_and_delete(url: str) -> None:
    ok("schedules", "create", "clis_tick", "--every", "3600", "--id", "hourly", "--store", url)
    [created] = stored(url)

    paused = ok("schedules", "pause", "hourly", "--store", url).stdout.strip()
    assert paused == "paused schedule hourly: clis_tick, every 3600s, paused"
    assert [r.enabled for r in stored(url)] == [False]
    row = ok("schedules", "list", "--store", url).stdout.splitlines()[1].split()
    assert row[:6] == ["hourly", "clis_tick", "every", "3600s", "UTC", "paused"]
    assert ok_json("schedules", "pause", "hourly", "--store", url)["schedule"]["enabled"] is False

    time.sleep(0.05)  # so that "the next slot after now" differs from the first one
    resumed = ok_json("schedules", "resume", "hourly", "--store", url)["schedule"]
    assert resumed["enabled"] is True
    [record] = stored(url)
    # Resuming starts from the next slot after now: the paused time is not backfilled.
    assert record.enabled and record.next_fire_at > created.next_fire_at
    assert "resumed schedule hourly" in ok("schedules", "resume", "hourly", "--store", url).stdout

    assert ok("schedules", "delete", "hourly", "--store", url).stdout.strip() == (
        "deleted schedule hourly"
    )
    assert stored(url) == []
    assert_one_error_line(invoke("schedules", "delete", "hourly", "--store", url), 1, "hourly")
    ok("schedules", "create", "clis_tick", "--every", "60", "--id", "x", "--store", url)
    assert ok_json("schedules", "delete", "x", "--store", url) == {"deleted": "x"}


# -- runs signal -------------------------------------------------------------------------
async def _waiting_run(url: str) -> str:
    """A clis_approval run suspended in ``wait_for_signal('approve')``."""
    store = SqliteStore(url.removeprefix("sqlite:///"))
    await store.open()
    try:
        runner = InlineWorkflowRunner(store)
        handle = await runner.client.submit("clis_approval", {"order": "A-1"})
        with pytest.raises(ResultTimeout):
            await runner.execute(handle)  # suspends: the signal has not come
        assert await handle.status() is RunStatus.WAITING
        return handle.run_id
    finally:
        await store.close()


async def _execute(url: str, run_id: str) -> Any:
    store = SqliteStore(url.removeprefix("sqlite:///"))
    await store.open()
    try:
        runner = InlineWorkflowRunner(store)
        return await runner.execute(runner.client.handle("clis_approval", run_id))
    finally:
        await store.close()


def test_runs_signal_wakes_a_waiting_run_with_its_payload(url: str) -> None:
    run_id = asyncio.run(_waiting_run(url))
    result = ok("runs", "signal", run_id, "approve", "--payload", '{"by": "ana"}',
                "--store", url)  # fmt: skip
    assert result.stdout.strip() == (
        f"signal 'approve' sent to run {run_id} (clis_approval), now queued"
    )
    assert asyncio.run(_execute(url, run_id)) == {"order": "A-1", "decision": {"by": "ana"}}


def test_runs_signal_before_the_wait_is_kept_and_json(url: str) -> None:
    async def submit() -> str:
        store = SqliteStore(url.removeprefix("sqlite:///"))
        try:
            client = InlineWorkflowRunner(store).client
            return (await client.submit("clis_approval", {"order": "B-2"})).run_id
        finally:
            await store.close()

    run_id = asyncio.run(submit())
    doc = ok_json("runs", "signal", run_id, "approve", "--store", url)  # no payload: null
    assert doc["signal"] == "approve"
    assert doc["run"]["run_id"] == run_id and doc["run"]["status"] == "queued"
    assert asyncio.run(_execute(url, run_id)) == {"order": "B-2", "decision": None}


def test_runs_signal_errors(url: str) -> None:
    run_id = asyncio.run(_waiting_run(url))
    assert_one_error_line(
        invoke("runs", "signal", "nope", "approve", "--store", url), 1, "no run with id 'nope'"
    )
    bad = invoke("runs", "signal", run_id, "approve", "--payload", "{oops", "--store", url)
    assert_one_error_line(bad, 2, "--payload is not valid JSON")
    ok("runs", "signal", run_id, "approve", "--payload", "true", "--store", url)
    asyncio.run(_execute(url, run_id))  # completes
    ended = invoke("runs", "signal", run_id, "approve", "--store", url)
    assert_one_error_line(ended, 1, "completed")


# -- a worker fires what the CLI created -------------------------------------------------
@pytest.fixture
def worker(url: str) -> Iterator[WorkflowWorker]:
    """A WorkflowWorker serving clis_tick on the file, in a thread; stopped at teardown."""
    worker = WorkflowWorker(
        store=SqliteStore(url.removeprefix("sqlite:///")),
        workflows=[clis_tick],
        options=WorkerOptions(claim_poll_interval=0.05, schedule_poll_interval=0.2),
    )
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


@pytest.mark.slow
def test_worker_fires_a_schedule_created_by_the_cli(url: str, worker: WorkflowWorker) -> None:
    ok("schedules", "create", "clis_tick", "--every", "1", "--params", '{"n": 41}',
       "--id", "tick", "--store", url)  # fmt: skip
    deadline = time.monotonic() + FIRE_LIMIT
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = ok_json("runs", "list", "--workflow", "clis_tick", "--status", "completed",
                       "--store", url)["runs"]  # fmt: skip
        if runs:
            break
        time.sleep(0.1)
    assert runs, "the schedule never fired"
    assert runs[-1]["result"] == 42
    assert runs[-1]["idempotency_key"].startswith("schedule:tick:")
    [schedule] = ok_json("schedules", "list", "--store", url)["schedules"]
    assert schedule["last_fire_at"] is not None

    # Paused, it fires nothing more.
    ok("schedules", "pause", "tick", "--store", url)
    count = len(ok_json("runs", "list", "--workflow", "clis_tick", "--store", url)["runs"])
    time.sleep(2.5)
    assert len(ok_json("runs", "list", "--workflow", "clis_tick", "--store", url)["runs"]) == count


# -- runs show: the journal entries of waits --------------------------------------------
def test_runs_show_renders_a_backoff_entry_as_its_value(url: str) -> None:
    async def suspended_in_backoff() -> str:
        store = SqliteStore(url.removeprefix("sqlite:///"))
        try:
            runner = InlineWorkflowRunner(store)
            handle = await runner.client.submit("clis_backoff")
            with pytest.raises(ResultTimeout):
                await runner.execute(handle)  # a 600 s backoff: the run sleeps on a timer
            assert await handle.status() is RunStatus.SLEEPING
            return handle.run_id
        finally:
            await store.close()

    run_id = asyncio.run(suspended_in_backoff())
    journal = ok_json("runs", "show", run_id, "--store", url)["journal"]
    backoff, sleep = journal[0], journal[1]
    assert backoff["kind"] == "backoff" and backoff["position"] < 0
    assert backoff["error"] is None and backoff["value"]["attempt"] == 1
    assert sleep["kind"] == "sleep" and sleep["name"] == "nap"
    table = ok("runs", "show", run_id, "--store", url).stdout
    row = next(line for line in table.splitlines() if " backoff " in line)
    assert '{"attempt":1,"wake_at":' in row
