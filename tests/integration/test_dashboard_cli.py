"""The dashboard's actions on the command line: ``pyrula runs bulk retry|cancel`` and
``pyrula schedules run-now``, in-process (CliRunner) on a real SQLite store file; each
records the action in the history the dashboard shows."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pyrula.cli.dashboard.actions import history
from pyrula.workflows import Schedule, SqliteStore
from pyrula.workflows.sync import WorkflowClient
from tests.integration.cli_checks import assert_one_error_line, invoke, ok, ok_json


def _history(db: Path, kind: str, key: str) -> list[tuple[str, str]]:
    async def read() -> list[tuple[str, str]]:
        store = SqliteStore(db)
        await store.open()
        try:
            return [(a["action"], a["by"]) for a in await history(store, kind, key)]
        finally:
            await store.close()

    return asyncio.run(read())


def test_bulk_cancel_then_retry_of_a_filter(tmp_path: Path) -> None:
    db = tmp_path / "pyrula.db"
    url = f"sqlite:///{db}"
    with WorkflowClient(SqliteStore(db), require_registered=False) as client:
        mine = [client.submit("cli_nobody", {"i": i}, owner="acme").run_id for i in range(3)]
        other = client.submit("cli_nobody", {"i": 9}, owner="other").run_id
    done = ok_json("runs", "bulk", "cancel", "--owner", "acme", "--store", url)
    assert (done["selected"], done["done"], done["skipped"], done["finished"]) == (3, 3, 0, True)
    shown = ok_json("runs", "list", "--owner", "acme", "--store", url)
    assert {r["status"] for r in shown["runs"]} == {"cancelled"}
    assert ok_json("runs", "show", other, "--store", url)["run"]["status"] == "queued"
    again = ok("runs", "bulk", "retry", "--owner", "acme", "--yes", "--store", url).stdout
    assert again.strip() == (
        "retry: 3 done, 0 skipped (not in a state to retry), 0 failed, of 3 selected"
    )
    actions = _history(db, "run", mine[0])
    assert [a for a, _ in actions] == ["cancel", "retry"]
    assert all(by.startswith("cli") for _, by in actions)
    # asked first without --yes; "n" changes nothing
    declined = invoke("runs", "bulk", "cancel", "--owner", "acme", "--store", url, stdin="n\n")
    assert declined.exit_code == 1
    assert ok_json("runs", "show", mine[0], "--store", url)["run"]["status"] == "queued"


def test_bulk_needs_a_filter_and_good_times(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pyrula.db'}"
    assert_one_error_line(invoke("runs", "bulk", "cancel", "--store", url), 2, "give a filter")
    assert_one_error_line(
        invoke("runs", "bulk", "retry", "--since", "soon", "--yes", "--store", url),
        2,
        "since must be an ISO-8601 time",
    )


def test_schedules_run_now(tmp_path: Path) -> None:
    db = tmp_path / "pyrula.db"
    url = f"sqlite:///{db}"
    store = SqliteStore(db)
    store.schedule_create(Schedule.create("cli_nobody", cron="0 3 * * *", params={"x": 1},
                                          schedule_id="nightly", owner="ops"))  # fmt: skip
    shown = ok_json("schedules", "run-now", "nightly", "--store", url)
    run = shown["run"]
    assert (run["workflow"], run["params"], run["owner"], run["status"]) == (
        "cli_nobody", {"x": 1}, "ops", "queued",
    )  # fmt: skip
    assert shown["schedule"]["last_run_id"] is None  # its timing is not touched
    assert _history(db, "schedule", "nightly")[0][0] == "run-now"
    assert _history(db, "run", run["run_id"])[0][0] == "run-now"
    assert_one_error_line(
        invoke("schedules", "run-now", "nope", "--store", url), 1, "no schedule with id 'nope'"
    )
