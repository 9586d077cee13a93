"""``pyrula runs submit``: a run queued from the command line, checked as a client that
imports the workflow checks it, against a real SQLite store file; ``--wait`` with a
worker serving that file on a thread."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from pyrula.cli.main import cli
from pyrula.workflows import RunStatus, SqliteStore, WorkerOptions, WorkflowWorker
from pyrula.workflows.records import RunRecord
from tests.fixtures import cli_workflows

MODULE = "tests.fixtures.cli_workflows"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def stored(path: Path) -> list[RunRecord]:
    async def read() -> list[RunRecord]:
        store = SqliteStore(path)
        await store.open()
        try:
            return await store.list_runs()
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "pyrula.db"


@pytest.fixture
def worker(db: Path) -> Iterator[None]:
    """A worker for the cli_ workflows on the same file, on its own thread and loop."""
    store = SqliteStore(db)
    options = WorkerOptions(claim_poll_interval=0.02, timer_poll_interval_s=0.1)
    flows = [cli_workflows.cli_add, cli_workflows.cli_fail]
    instance = WorkflowWorker(store=store, workflows=flows, options=options)
    thread = threading.Thread(target=lambda: asyncio.run(instance.run()), daemon=True)
    thread.start()
    try:
        yield
    finally:
        instance.stop()
        thread.join(timeout=30)


def test_a_run_is_queued_with_its_params_checked_by_the_imported_workflow(db: Path) -> None:
    url = f"sqlite:///{db}"
    ok = invoke("runs", "submit", "cli_add", "--workflow", MODULE, "--store", url,
                "--params", '{"a": 1, "b": 2}', "--owner", "t-1", "--delay", "30")  # fmt: skip
    assert ok.exit_code == 0, ok.output
    (run,) = stored(db)
    assert ok.output == f"submitted run {run.run_id} (cli_add), queued\n"
    assert json.loads(run.params) == {"a": 1, "b": 2}
    assert run.owner == "t-1" and run.status is RunStatus.QUEUED
    assert run.available_at >= run.created_at + 29
    # Params that don't fit the signature: a usage error, nothing stored (-w is --workflow).
    bad = invoke("runs", "submit", "cli_add", "-w", MODULE, "--store", url,
                 "--params", '{"a": 1}')  # fmt: skip
    assert bad.exit_code == 2 and "missing a required argument: 'b'" in bad.output
    assert len(stored(db)) == 1


def test_a_repeated_idempotency_key_finds_the_first_run(db: Path) -> None:
    args = ("runs", "submit", "cli_add", "--workflow", MODULE, "--store", f"sqlite:///{db}",
            "--params", '{"a": 1, "b": 2}', "--idempotency-key", "order-7")  # fmt: skip
    first = invoke(*args, "--json")
    again = invoke(*args, "--json")
    assert first.exit_code == again.exit_code == 0
    one, two = json.loads(first.output), json.loads(again.output)
    assert (one["created"], two["created"]) == (True, False)
    assert one["run"]["run_id"] == two["run"]["run_id"]
    assert "found (same idempotency key)" in invoke(*args).output
    assert len(stored(db)) == 1


def test_a_name_alone_needs_unchecked(db: Path) -> None:
    url = f"sqlite:///{db}"
    refused = invoke("runs", "submit", "cli_add", "--store", url)
    assert refused.exit_code == 2 and "--workflow MODULE" in refused.output
    unknown = invoke("runs", "submit", "nope", "--workflow", MODULE, "--store", url)
    assert unknown.exit_code == 2 and "no workflow named 'nope'" in unknown.output
    assert "cli_add" in unknown.output
    assert stored(db) == []
    # --unchecked queues it by name: a worker that knows it will run it.
    queued = invoke("runs", "submit", "elsewhere", "--unchecked", "--store", url)
    assert queued.exit_code == 0 and "(elsewhere), queued" in queued.output
    assert [r.workflow for r in stored(db)] == ["elsewhere"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--params", "[1]", "--unchecked"), "--params must be a JSON object"),
        (("--params", "{nope", "--unchecked"), "--params is not valid JSON"),
        (("--params", '{"a": NaN}', "--unchecked"), "NaN is not allowed"),
        (("--unchecked", "--timeout", "3"), "--timeout goes with --wait"),
        (("--unchecked", "--workflow", MODULE), "not both"),
        (("--unchecked", "--delay", "-1"), "delay"),
        (("--unchecked", "--idempotency-key", ""), "idempotency_key"),
    ],
)
def test_bad_input_is_a_usage_error_and_stores_nothing(
    db: Path, args: tuple[str, ...], message: str
) -> None:
    result = invoke("runs", "submit", "elsewhere", "--store", f"sqlite:///{db}", *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert stored(db) == []


def test_wait_prints_the_result_or_the_error(db: Path, worker: None) -> None:
    url = f"sqlite:///{db}"
    done = invoke("runs", "submit", "cli_add", "--workflow", MODULE, "--store", url,
                  "--params", '{"a": 2, "b": 3}', "--wait", "--timeout", "30")  # fmt: skip
    assert done.exit_code == 0, done.output
    assert done.output.endswith(', completed\n{"sum":5,"doubled":10}\n')
    failed = invoke("runs", "submit", "cli_fail", "--workflow", MODULE, "--store", url,
                    "--params", '{"message": "kaput"}', "--wait", "--timeout", "30")  # fmt: skip
    assert failed.exit_code == 1
    assert ", failed\nbuiltins.ValueError: kaput\n" in failed.output
    assert "ended failed" in failed.output
    # Nothing serves this one: --wait gives up after --timeout, exit 1; the run stays.
    late = invoke("runs", "submit", "elsewhere", "--unchecked", "--store", url,
                  "--wait", "--timeout", "0.3")  # fmt: skip
    assert late.exit_code == 1 and "did not end in time" in late.output
    assert ", queued\n" in late.output
