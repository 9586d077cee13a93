"""The ``pyrula`` CLI in-process (click's CliRunner) against a real SQLite store file.

The store is filled through the public client and the InlineWorkflowRunner; the commands
then read and change it as a user would. ``test_cli_worker.py`` runs real worker
processes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pyrula.cli.render import duration_text, iso, mask_url
from pyrula.cli.worker import WORKER_FLAGS, flag_name, options_from_params, worker_command
from pyrula.workflows import (
    DurableInvocationError,
    InlineWorkflowRunner,
    RunStatus,
    SqliteStore,
    WorkerOptions,
)
from tests.fixtures import cli_workflows
from tests.integration.cli_checks import assert_one_error_line, invoke

LONG_TEXT = "x" * 250 + "END"


@dataclass(frozen=True)
class Populated:
    url: str
    path: Path
    completed: str
    failed: str
    queued: str
    running: str
    echoed: str


async def _populate(path: Path) -> Populated:
    store = SqliteStore(path)
    await store.open()
    try:
        runner = InlineWorkflowRunner(store)
        completed = await runner.client.submit(cli_workflows.cli_add, {"a": 2, "b": 3})
        assert await runner.execute(completed) == {"sum": 5, "doubled": 10}
        failed = await runner.client.submit("cli_fail", {"message": "kaput"}, owner="tenant-a")
        with pytest.raises(DurableInvocationError):
            await runner.execute(failed)
        echoed = await runner.client.submit("cli_echo", {"text": LONG_TEXT})
        assert await runner.execute(echoed) == LONG_TEXT
        queued = await runner.client.submit("cli_add", {"a": 1, "b": 1}, owner="tenant-b")
        running = await runner.client.submit("cli_gate", {"path": str(path) + ".gate"})
        leases = await store.claim_runs("test-worker", ["cli_gate"], 1, 600.0)
        assert [lease.run_id for lease in leases] == [running.run_id]
    finally:
        await store.close()
    return Populated(
        url=f"sqlite:///{path}",
        path=path,
        completed=completed.run_id,
        failed=failed.run_id,
        queued=queued.run_id,
        running=running.run_id,
        echoed=echoed.run_id,
    )


@pytest.fixture
def populated(tmp_path: Path) -> Populated:
    return asyncio.run(_populate(tmp_path / "pyrula.db"))


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """``pyrula worker`` configures the root logger; undo that after each test."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def status_of(store: Populated, run_id: str) -> str:
    result = invoke("runs", "show", run_id, "--store", store.url, "--json")
    assert result.exit_code == 0, result.output
    return str(json.loads(result.stdout)["run"]["status"])


# -- the worker's flags ----------------------------------------------------------------
def test_every_worker_option_field_has_a_flag() -> None:
    options = {p.name: p for p in worker_command.params}
    for field in dataclasses.fields(WorkerOptions):
        assert field.name in options, f"WorkerOptions.{field.name} has no pyrula worker flag"
        assert flag_name(field.name) in options[field.name].opts
    expected = {
        "--max-concurrent-runs", "-c", "--claim-poll-interval", "--timer-poll-interval",
        "--timer-max-batch", "--orphan-scan-interval", "--shutdown-grace", "--cancel-timeout",
        "--shard-lease-interval", "--lock-ttl", "--max-recoveries", "--max-payload-bytes",
        "--worker-id", "--workflow", "--store", "--loglevel", "-l",
    }  # fmt: skip
    declared = {opt for p in worker_command.params for opt in p.opts}
    assert expected <= declared


def test_worker_flags_build_the_options_they_name() -> None:
    args = ["--workflow", "m"]
    wanted: dict[str, object] = {}
    for spec in WORKER_FLAGS:
        default = spec.default
        if spec.metavar == "TEXT":
            value: object = "worker-7"
        else:
            value = default + 7 if isinstance(default, int) else 2.5
        wanted[spec.field] = value
        args += [spec.flag, str(value)]
    ctx = worker_command.make_context("worker", args)
    options = options_from_params(ctx.params)
    assert dataclasses.asdict(options) == wanted


def test_worker_flags_left_out_keep_the_defaults() -> None:
    ctx = worker_command.make_context("worker", ["--workflow", "m", "-c", "3"])
    assert options_from_params(ctx.params) == WorkerOptions(max_concurrent_runs=3)


def test_worker_help_documents_each_flag_with_its_default() -> None:
    result = invoke("worker", "--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    for spec in WORKER_FLAGS:
        assert spec.flag in text
    assert "A run's lease lasts this long" in text
    assert "[default: 30.0]" in text and "[default: 50]" in text


def test_worker_bad_option_value_exits_2_naming_the_flag() -> None:
    result = invoke("worker", "--workflow", "tests.fixtures.cli_workflows", "--lock-ttl", "0")
    assert_one_error_line(result, 2, "--lock-ttl", "must be > 0")


def test_worker_module_that_does_not_import_exits_2() -> None:
    result = invoke("worker", "--workflow", "tests.fixtures.no_such_module_here")
    assert_one_error_line(result, 2, "cannot import workflow module", "no_such_module_here")


def test_worker_bad_store_url_exits_2() -> None:
    result = invoke("worker", "--workflow", "tests.fixtures.cli_workflows", "--store", "ftp://x")
    assert_one_error_line(result, 2, "ftp://x")


# -- runs list -------------------------------------------------------------------------
def test_runs_list_table_shows_every_run(populated: Populated) -> None:
    result = invoke("runs", "list", "--store", populated.url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["RUN", "ID", "WORKFLOW"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[populated.completed][1:3] == ["cli_add", "completed"]
    assert rows[populated.failed][1:4] == ["cli_fail", "failed", "tenant-a"]
    assert rows[populated.queued][1:4] == ["cli_add", "queued", "tenant-b"]
    assert rows[populated.running][1:3] == ["cli_gate", "running"]
    assert rows[populated.completed][3] == "(default)"
    assert rows[populated.running][-1] == "test-worker"
    assert rows[populated.completed][4].endswith("Z")
    # Columns line up: every row's STATUS starts where the header's does.
    status_at = lines[0].index("STATUS")
    assert all(line[status_at - 2 : status_at] == "  " for line in lines[1:])


def test_runs_list_filters_and_json(populated: Populated) -> None:
    def ids(*args: str) -> list[str]:
        result = invoke("runs", "list", "--store", populated.url, "--json", *args)
        assert result.exit_code == 0, result.output
        return [run["run_id"] for run in json.loads(result.stdout)["runs"]]

    assert ids("--status", "failed") == [populated.failed]
    assert set(ids("--workflow", "cli_add")) == {populated.completed, populated.queued}
    assert ids("--owner", "tenant-b") == [populated.queued]
    assert len(ids("--limit", "2")) == 2
    assert len(ids()) == 5
    assert ids("--workflow", "nothing_like_it") == []


def test_runs_list_json_carries_whole_records(populated: Populated) -> None:
    result = invoke("runs", "list", "--store", populated.url, "--json", "--status", "completed")
    runs = {run["run_id"]: run for run in json.loads(result.stdout)["runs"]}
    run = runs[populated.completed]
    assert run["params"] == {"a": 2, "b": 3}
    assert run["result"] == {"sum": 5, "doubled": 10}
    assert run["error"] is None and run["claims"] == 1
    assert run["created_at"].endswith("Z") and run["duration_s"] >= 0
    assert runs[populated.echoed]["result"] == LONG_TEXT


def test_runs_list_empty_store(tmp_path: Path) -> None:
    result = invoke("runs", "list", "--store", f"sqlite:///{tmp_path / 'empty.db'}")
    assert result.exit_code == 0 and result.stdout.strip() == "no runs"


def test_store_url_comes_from_the_environment(populated: Populated) -> None:
    result = invoke("runs", "list", "--json", env={"PYRULA_STORE_URL": populated.url})
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["runs"]) == 5


# -- runs show -------------------------------------------------------------------------
def test_runs_show_failed_run_has_error_traceback_and_journal(populated: Populated) -> None:
    result = invoke("runs", "show", populated.failed, "--store", populated.url)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Status           failed" in out and "Owner            tenant-a" in out
    assert "Error            builtins.ValueError: kaput" in out
    assert "Traceback (most recent call last):" in out and "raise ValueError(message)" in out
    journal = out[out.index("Journal (2 entries)") :].splitlines()
    assert journal[1].split() == ["POS", "KIND", "NAME", "OK", "ATTEMPTS", "RECORDED", "VALUE"]
    assert journal[2].split()[:5] == ["0", "step", "add", "yes", "1"]
    assert journal[2].split()[-1] == "3"
    assert journal[3].split()[:5] == ["1", "step", "explode", "no", "2"]
    assert journal[3].endswith("builtins.ValueError: kaput")


def test_runs_show_truncates_in_the_table_and_not_in_json(populated: Populated) -> None:
    table = invoke("runs", "show", populated.echoed, "--store", populated.url).stdout
    assert "END" not in table and "..." in table
    document = json.loads(
        invoke("runs", "show", populated.echoed, "--store", populated.url, "--json").stdout
    )
    assert document["run"]["result"] == LONG_TEXT
    assert document["journal"][0]["value"] == LONG_TEXT
    assert document["journal"][0]["ok"] is True and document["journal"][0]["error"] is None


def test_runs_show_json_of_failed_run(populated: Populated) -> None:
    result = invoke("runs", "show", populated.failed, "--store", populated.url, "--json")
    document = json.loads(result.stdout)
    assert document["run"]["error"]["type"] == "builtins.ValueError"
    assert document["run"]["error"]["message"] == "kaput"
    assert "Traceback" in document["run"]["error"]["traceback"]
    explode = document["journal"][1]
    assert explode["ok"] is False and explode["attempts"] == 2 and explode["value"] is None
    assert explode["error"]["type"] == "builtins.ValueError"


def test_runs_show_running_run_shows_its_lease(populated: Populated) -> None:
    out = invoke("runs", "show", populated.running, "--store", populated.url).stdout
    assert "Status           running" in out and "Worker           test-worker" in out
    assert "Lease            token 1, expires " in out
    assert "Journal (0 entries)" in out


def test_runs_show_unknown_run_exits_1(populated: Populated) -> None:
    result = invoke("runs", "show", "no-such-run", "--store", populated.url)
    assert_one_error_line(result, 1, "no run with id 'no-such-run'")


# -- runs retry / cancel ---------------------------------------------------------------
def test_runs_retry_requeues_a_failed_run_keeping_finished_steps(populated: Populated) -> None:
    result = invoke("runs", "retry", populated.failed, "--store", populated.url)
    assert result.exit_code == 0, result.output
    assert populated.failed in result.stdout and "queued again" in result.stdout
    shown = json.loads(
        invoke("runs", "show", populated.failed, "--store", populated.url, "--json").stdout
    )
    assert shown["run"]["status"] == "queued" and shown["run"]["error"] is None
    assert [entry["name"] for entry in shown["journal"]] == ["add"]


def test_runs_retry_of_a_completed_run_exits_1(populated: Populated) -> None:
    result = invoke("runs", "retry", populated.completed, "--store", populated.url)
    assert_one_error_line(result, 1, populated.completed)
    assert status_of(populated, populated.completed) == "completed"


def test_runs_cancel_queued_run(populated: Populated) -> None:
    result = invoke("runs", "cancel", populated.queued, "--store", populated.url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["run"]["status"] == "cancelled"
    assert status_of(populated, populated.queued) == "cancelled"


def test_runs_cancel_running_run_requests_it(populated: Populated) -> None:
    result = invoke("runs", "cancel", populated.running, "--store", populated.url)
    assert result.exit_code == 0, result.output
    assert "cancel requested" in result.stdout
    shown = json.loads(
        invoke("runs", "show", populated.running, "--store", populated.url, "--json").stdout
    )
    assert shown["run"]["status"] == "running" and shown["run"]["cancel_requested"] is True
    listed = invoke("runs", "list", "--store", populated.url, "--status", "running").stdout
    assert "running (cancel requested)" in listed


def test_runs_cancel_terminate_ends_a_running_run(populated: Populated) -> None:
    result = invoke("runs", "cancel", populated.running, "--terminate", "--store", populated.url)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("terminated")
    assert status_of(populated, populated.running) == RunStatus.TERMINATED.value
    again = invoke("runs", "retry", populated.running, "--store", populated.url)
    assert again.exit_code == 0 and status_of(populated, populated.running) == "queued"


def test_runs_cancel_of_a_finished_run_exits_1(populated: Populated) -> None:
    result = invoke("runs", "cancel", populated.completed, "--store", populated.url)
    assert_one_error_line(result, 1, populated.completed)


def test_runs_bad_store_url_exits_1(tmp_path: Path) -> None:
    assert_one_error_line(invoke("runs", "list", "--store", "ftp://x"), 1, "ftp://x")
    missing = f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}"
    assert_one_error_line(invoke("runs", "list", "--store", missing), 1, "dir.db")


def test_runs_usage_errors_exit_2(populated: Populated) -> None:
    assert invoke("runs", "list", "--status", "bogus", "--store", populated.url).exit_code == 2
    assert invoke("runs", "list", "--limit", "0", "--store", populated.url).exit_code == 2
    assert invoke("runs", "show", "--store", populated.url).exit_code == 2
    assert invoke("runs", "frobnicate").exit_code == 2


def test_runs_purge_deletes_the_runs_that_ended_long_enough_ago(populated: Populated) -> None:
    kept = invoke("runs", "purge", "--older-than", "1h", "--store", populated.url)
    assert kept.exit_code == 0, kept.output
    assert kept.stdout.strip() == "deleted 0 runs that ended over 1h ago"
    time.sleep(0.3)
    result = invoke("runs", "purge", "--older-than", "0.2s", "--store", populated.url, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"deleted": 3, "older_than_s": 0.2}
    listed = json.loads(invoke("runs", "list", "--store", populated.url, "--json").stdout)
    assert {run["run_id"] for run in listed["runs"]} == {populated.queued, populated.running}
    assert invoke("runs", "show", populated.completed, "--store", populated.url).exit_code == 1


@pytest.mark.parametrize("age", ["0", "-5", "soon", "7w", "", "1.5.2d"])
def test_runs_purge_refuses_what_is_not_an_age(populated: Populated, age: str) -> None:
    result = invoke("runs", "purge", "--older-than", age, "--store", populated.url)
    assert result.exit_code == 2 and "--older-than" in result.output, result.output


def test_ages() -> None:
    from pyrula.cli.runs import parse_age

    assert [parse_age(a) for a in ("90", "90s", "1.5m", "12h", " 7d ", ".5")] == [
        90.0, 90.0, 90.0, 43200.0, 604800.0, 0.5,
    ]  # fmt: skip


# -- rendering -------------------------------------------------------------------------
def test_mask_url_hides_passwords_only() -> None:
    assert mask_url("valkey://user:s3cret@host:6379/0") == "valkey://user:***@host:6379/0"
    assert mask_url("redis://:s3cret@host") == "redis://:***@host"
    assert mask_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"


def test_durations_and_times() -> None:
    assert [duration_text(s) for s in (None, 0.25, 12, 184, 7500, 273600)] == [
        "-", "0.25s", "12.0s", "3m04s", "2h05m", "3d04h",
    ]  # fmt: skip
    assert iso(0.0) == "1970-01-01T00:00:00Z"
    assert iso(1.5, precise=True) == "1970-01-01T00:00:01.500Z"
