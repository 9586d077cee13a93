"""``pyrula triggers list|send`` and ``pyrula projections list|reset``, in-process
(CliRunner) on a real SQLite store file.

The triggers and projections are defined in ``cli_trigger_defs``, which the commands
import with ``--import``; the ``defs`` fixture takes them out of the default registries
again afterwards. Each CLI call opens and closes the file, as separate commands from a
shell would; the tests read and drive the same file through the store's own API (the
firer and the projection runner a worker uses).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest

from pyrula.cli import projections as cli_projections
from pyrula.cli.projections import START_CURSOR, newest_ended
from pyrula.workflows import MemoryStore, SqliteStore, Store, WorkflowClient
from pyrula.workflows.projections import ProjectionRunner, default_projections
from pyrula.workflows.records import RunStatus, TriggerEvent
from pyrula.workflows.triggering import TriggerFirer
from pyrula.workflows.triggers import default_triggers
from tests.integration.cli_checks import assert_one_error_line, invoke, ok, ok_json
from tests.stores.conftest import START, FakeClock

T = TypeVar("T")

MODULE = "tests.integration.cli_trigger_defs"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'pyrula.db'}"


@pytest.fixture
def defs() -> Iterator[str]:
    """The module's name for ``--import``; afterwards its triggers and projections are
    unregistered and the module forgotten (so the next test imports it afresh)."""
    assert MODULE not in sys.modules
    yield MODULE
    module = sys.modules.pop(MODULE, None)
    if module is not None:
        for name in module.TRIGGERS:
            default_triggers.unregister(name)
        for name in module.PROJECTIONS:
            default_projections.unregister(name)
    assert not [t for t in default_triggers.all() if t.name.startswith("clit_")]
    assert not [p for p in default_projections.all() if p.name.startswith("clit_")]


def loaded() -> ModuleType:
    return importlib.import_module(MODULE)


def on_store(url: str, action: Callable[[Store], Awaitable[T]]) -> T:
    async def main() -> T:
        store = SqliteStore(url.removeprefix("sqlite:///"))
        await store.open()
        try:
            return await action(store)
        finally:
            await store.close()

    return asyncio.run(main())


def waiting(url: str, trigger: str) -> list[TriggerEvent]:
    return on_store(url, lambda store: store.read_events(trigger, 100_000))


def cursor(url: str, name: str) -> str | None:
    return on_store(url, lambda store: store.get_cursor(name))


def end_runs(url: str, *run_ids: str, workflow: str = "clit_index") -> None:
    """Queue and cancel each run (it ends at once), in order."""

    async def act(store: Store) -> None:
        client = WorkflowClient(store, require_registered=False)
        for run_id in run_ids:
            await client.submit(workflow, {}, run_id=run_id)
            await store.cancel_run(run_id)

    on_store(url, act)


def deliver_all(url: str, name: str, worker: str = "w-1") -> None:
    """What a worker's projection loop does: take the lease, deliver until caught up."""
    loaded()
    item = next(p for p in default_projections.all() if p.name == name)

    async def act(store: Store) -> None:
        runner = ProjectionRunner(store, item, worker)
        assert await runner.hold()
        while await runner.step():
            pass

    on_store(url, act)


# -- triggers list -------------------------------------------------------------------------
def test_triggers_list_without_definitions_says_so(url: str) -> None:
    assert "no batch triggers" in ok("triggers", "list", "--store", url).stdout
    assert ok_json("triggers", "list", "--store", url) == {"triggers": []}


def test_send_then_list_shows_the_waiting_events_and_the_oldest_age(url: str, defs: str) -> None:
    result = ok("triggers", "send", "clit_docs", '{"id": 1}', "[2]", '"three"', "--store", url)
    assert result.stdout.strip() == "sent 3 event(s) to trigger clit_docs: seq 1-3"
    assert [json.loads(e.payload) for e in waiting(url, "clit_docs")] == [{"id": 1}, [2], "three"]
    time.sleep(0.05)  # the oldest event is older than 0

    table = ok("triggers", "list", "--import", defs, "--store", url).stdout.splitlines()
    assert table[0].split() == ["TRIGGER", "WORKFLOW", "MAX", "SIZE", "MAX", "WAIT", "WAITING",
                                "OLDEST"]  # fmt: skip
    assert table[1].split()[:5] == ["clit_docs", "clit_index", "3", "1m00s", "3"]
    assert table[2].split() == ["clit_quick", "clit_index", "100", "0.50s", "0", "-"]

    doc = ok_json("triggers", "list", "--import", defs, "--store", url)
    docs, quick = doc["triggers"]
    assert docs["name"] == "clit_docs" and docs["defined"] is True
    assert (docs["workflow"], docs["max_size"], docs["max_wait_s"], docs["param"]) == (
        "clit_index", 3, 60.0, "events",
    )  # fmt: skip
    assert (docs["waiting"], docs["waiting_capped"]) == (3, False)
    assert 0.05 <= docs["oldest_age_s"] < 30
    assert (quick["param"], quick["waiting"], quick["oldest_age_s"]) == ("items", 0, None)


def test_list_names_show_buffers_no_imported_code_defines(url: str, defs: str) -> None:
    ok("triggers", "send", "elsewhere", "1", "--store", url)
    table = ok("triggers", "list", "elsewhere", "clit_docs", "elsewhere", "--store", url).stdout
    lines = table.splitlines()
    assert len(lines) == 3  # the repeat is shown once
    *row, age = lines[1].split()
    assert row == ["elsewhere", "(not", "defined", "here)", "-", "-", "1"] and age.endswith("s")
    assert lines[2].split() == ["clit_docs", "(not", "defined", "here)", "-", "-", "0", "-"]

    doc = ok_json("triggers", "list", "clit_docs", "--import", defs, "--store", url)
    [only] = doc["triggers"]  # NAMEs pick the defined ones too
    assert (only["name"], only["defined"], only["workflow"]) == ("clit_docs", True, "clit_index")
    [other] = ok_json("triggers", "list", "elsewhere", "--store", url)["triggers"]
    assert (other["defined"], other["workflow"], other["max_size"]) == (False, None, None)


def test_list_counts_up_to_the_bound(url: str, tmp_path: Path) -> None:
    lines = tmp_path / "events.jsonl"
    lines.write_text("".join(f"{i}\n" for i in range(10_001)))
    ok("triggers", "send", "big", "--file", str(lines), "--store", url)
    assert "10000+" in ok("triggers", "list", "big", "--store", url).stdout
    [state] = ok_json("triggers", "list", "big", "--store", url)["triggers"]
    assert (state["waiting"], state["waiting_capped"]) == (10_000, True)


# -- triggers send -------------------------------------------------------------------------
def test_send_reads_a_file_or_stdin_one_value_per_line(url: str, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"a": 1}\n\n  \n[1, 2]\n"x"\n')
    doc = ok_json("triggers", "send", "t", "--file", str(events), "--store", url)
    assert doc == {"trigger": "t", "seqs": [1, 2, 3]}
    out = ok("triggers", "send", "t", "--file", "-", "--store", url, stdin="null\n4.5\n").stdout
    assert out.strip() == "sent 2 event(s) to trigger t: seq 4-5"
    assert [json.loads(e.payload) for e in waiting(url, "t")] == [
        {"a": 1}, [1, 2], "x", None, 4.5,
    ]  # fmt: skip
    assert ok("triggers", "send", "t", "--store", url, "--", "-1").stdout.endswith("seq 6\n")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("t", '{"ok": 1}', "{bad"), "JSON argument 2 is not valid JSON"),
        (("t", "[1]", '{"x": NaN}'), "JSON argument 2 is not valid JSON (NaN is not allowed)"),
        (("t",), "give at least one event"),
        (("", "1"), "trigger name must be a non-empty string"),
        (("a\tb", "1"), "control character"),
        (("t", '"' + "x" * 1_100_000 + '"'), "event 0 of trigger 't'"),
    ],
)
def test_send_bad_input_exits_2_and_stores_nothing(
    url: str, args: tuple[str, ...], needle: str
) -> None:
    assert_one_error_line(invoke("triggers", "send", *args, "--store", url), 2, needle)
    assert waiting(url, args[0]) == []


def test_send_a_bad_file_line_names_it_and_stores_nothing(url: str, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('1\n\n{"a": 1}\n{"a": \n')
    result = invoke("triggers", "send", "t", "--file", str(events), "--store", url)
    assert_one_error_line(result, 2, f"--file {events} line 4 is not valid JSON")
    assert waiting(url, "t") == []
    both = invoke("triggers", "send", "t", "1", "--file", str(events), "--store", url)
    assert_one_error_line(both, 2, "not both")
    empty = invoke("triggers", "send", "t", "--file", "-", "--store", url, stdin="\n")
    assert_one_error_line(empty, 2, "--file stdin holds no JSON value")
    assert invoke("triggers", "send", "t", "--file", str(tmp_path / "nope")).exit_code == 2


def test_sent_events_are_fired_as_a_batch(url: str, defs: str) -> None:
    ok("triggers", "send", "clit_docs", "1", "2", "3", "4", "--store", url)
    trigger = loaded().docs

    async def fire(store: Store) -> Any:
        await TriggerFirer(store).fire_ready(trigger)
        return await store.list_runs(workflow="clit_index")

    [run] = on_store(url, fire)  # max_size 3: one full batch; the 4th waits (max_wait 60)
    assert run.status is RunStatus.QUEUED and json.loads(run.params) == {"events": [1, 2, 3]}
    [state] = ok_json("triggers", "list", "clit_docs", "--store", url)["triggers"]
    assert state["waiting"] == 1
    assert [json.loads(e.payload) for e in waiting(url, "clit_docs")] == [4]


def test_an_import_that_fails_is_a_usage_error(url: str) -> None:
    result = invoke("triggers", "list", "--import", "tests.integration.no_such", "--store", url)
    assert_one_error_line(result, 2, "cannot import workflow module 'tests.integration.no_such'")


# -- projections list ----------------------------------------------------------------------
def test_projections_list_shows_position_lease_and_lag(url: str, defs: str) -> None:
    assert "no projections" in ok("projections", "list", "--store", url).stdout
    end_runs(url, "r1", "r2", "r3")
    table = ok("projections", "list", "--import", defs, "--store", url).stdout.splitlines()
    assert table[0].split() == ["PROJECTION", "WORKFLOWS", "BATCH", "SETTLE", "POSITION", "LEASE",
                                "BEHIND"]  # fmt: skip
    assert table[1].split() == ["clit_all", "all", "2", "0.00s", "not", "started", "nobody", "3"]
    assert table[2].split() == ["clit_states", "clit_index,clit_other", "50", "2.0s", "not",
                                "started", "nobody", "3"]  # fmt: skip

    deliver_all(url, "clit_all")
    assert loaded().DELIVERED == ["r1", "r2", "r3"]
    line = ok("projections", "list", "clit_all", "--import", defs, "--store", url).stdout
    row = line.splitlines()[1].split()
    assert row[4].startswith("20") and row[4].endswith("Z") and row[5] == "r3"
    assert row[6:8] == ["w-1", "until"] and row[-1] == "0"

    doc = ok_json("projections", "list", "--import", defs, "--store", url)
    every, states = doc["projections"]
    assert (every["name"], every["defined"], every["workflows"]) == ("clit_all", True, None)
    assert (every["batch_size"], every["settle_s"]) == (2, 0.0)
    assert every["position"]["run_id"] == "r3" and every["position"]["finished_at"].endswith("Z")
    assert json.loads(every["cursor"])[1] == "r3"
    assert every["lease"]["worker"] == "w-1" and every["lease"]["until"].endswith("Z")
    assert (every["behind"], every["behind_capped"]) == (0, False)
    assert states["workflows"] == ["clit_index", "clit_other"]
    assert (states["cursor"], states["position"], states["lease"]) == (None, None, None)
    assert states["behind"] == 3

    [named] = ok_json("projections", "list", "gone", "--store", url)["projections"]
    assert (named["defined"], named["workflows"], named["behind"]) == (False, None, 3)


# -- projections reset ---------------------------------------------------------------------
def test_reset_to_start_redelivers_and_to_now_skips(url: str, defs: str) -> None:
    end_runs(url, "r1", "r2", "r3")
    deliver_all(url, "clit_all")
    delivered = loaded().DELIVERED
    before = cursor(url, "projection:clit_all")

    doc = ok_json("projections", "reset", "clit_all", "--to-start", "--yes", "--import", defs,
                  "--store", url)  # fmt: skip
    assert doc["changed"] is True and doc["before"]["cursor"] == before
    assert doc["after"] == {"cursor": START_CURSOR, "position": None}
    assert cursor(url, "projection:clit_all") == START_CURSOR
    row = ok("projections", "list", "clit_all", "--import", defs, "--store", url).stdout
    assert "from the start (reset)" in row and row.rstrip().endswith("3")
    again = ok("projections", "reset", "clit_all", "--to-start", "--yes", "--store", url)
    assert "at the start already; nothing changed" in again.stdout  # known by its cursor
    deliver_all(url, "clit_all")
    assert delivered == ["r1", "r2", "r3"] * 2  # the sentinel reads as "from the first"
    text = ok("projections", "reset", "clit_all", "--to-start", "--yes", "--store", url).stdout
    assert text.startswith("projection clit_all: reset to the start (was: 20")
    deliver_all(url, "clit_all")
    assert delivered == ["r1", "r2", "r3"] * 3

    end_runs(url, "r4", "r5")
    result = ok("projections", "reset", "clit_all", "--to-now", "--yes", "--import", defs,
                "--store", url)  # fmt: skip
    assert result.stdout.startswith("projection clit_all: moved past the newest ended run, to 20")
    assert " r5 (was: 20" in result.stdout
    [state] = ok_json("projections", "list", "clit_all", "--store", url)["projections"]
    assert state["position"]["run_id"] == "r5" and state["behind"] == 0
    deliver_all(url, "clit_all")
    assert delivered == ["r1", "r2", "r3"] * 3  # r4, r5 skipped
    same = ok("projections", "reset", "clit_all", "--to-now", "--yes", "--store", url)
    assert "no run ended past its position" in same.stdout

    end_runs(url, "r6")
    deliver_all(url, "clit_all")
    assert delivered[-1] == "r6"


def test_reset_of_a_projection_never_started(url: str, defs: str) -> None:
    fresh = ok("projections", "reset", "clit_states", "--to-start", "--yes", "--import", defs,
               "--store", url)  # fmt: skip
    assert "not started, so it starts from the first ended run" in fresh.stdout
    assert cursor(url, "projection:clit_states") is None
    nothing = ok("projections", "reset", "clit_states", "--to-now", "--yes", "--import", defs,
                 "--store", url)  # fmt: skip
    assert "no run has ended" in nothing.stdout
    assert cursor(url, "projection:clit_states") is None

    end_runs(url, "r1", "r2")
    ok("projections", "reset", "clit_states", "--to-now", "--yes", "--import", defs,
       "--store", url)  # fmt: skip
    assert json.loads(cursor(url, "projection:clit_states") or "null")[1] == "r2"


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("clit_all", "--to-start"), 2, "pass --yes to do it"),
        (("clit_all", "--to-now"), 2, "skip every run ended until now"),
        (("clit_all", "--yes"), 2, "exactly one of --to-start or --to-now"),
        (("clit_all", "--to-start", "--to-now", "--yes"), 2, "exactly one of"),
        (("", "--to-start", "--yes"), 2, "projection name must be a non-empty string"),
        (("nope", "--to-now", "--yes"), 1, "no projection 'nope'"),
    ],
)
def test_reset_bad_input_changes_nothing(
    url: str, defs: str, args: tuple[str, ...], code: int, needle: str
) -> None:
    end_runs(url, "r1")
    result = invoke("projections", "reset", *args, "--import", defs, "--store", url)
    assert_one_error_line(result, code, needle)
    assert cursor(url, "projection:clit_all") is None
    assert cursor(url, "projection:nope") is None


def test_reset_that_races_a_worker_changes_nothing(
    url: str, defs: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    end_runs(url, "r1", "r2")
    real = cli_projections.newest_ended

    async def a_worker_delivers_meanwhile(store: Store, floor: Any) -> Any:
        assert await store.swap_cursor("projection:clit_all", None, '[1.0, "moved"]')
        return await real(store, floor)

    monkeypatch.setattr(cli_projections, "newest_ended", a_worker_delivers_meanwhile)
    result = invoke("projections", "reset", "clit_all", "--to-now", "--yes", "--import", defs,
                    "--store", url)  # fmt: skip
    assert_one_error_line(result, 1, "its cursor moved while resetting it", "run the command again")
    assert cursor(url, "projection:clit_all") == '[1.0, "moved"]'


async def test_newest_ended_looks_back_as_far_as_it_must(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_projections, "PAGE", 2)  # so the pages run out mid-window too
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await store.open()
    client = WorkflowClient(store, require_registered=False)
    assert await newest_ended(store, None) is None
    for run_id, gap in (("a", 0.0), ("b", 5000.0), ("c", 0.0), ("d", 0.0), ("e", 0.0)):
        clock.advance(gap)
        await client.submit("clit_index", {}, run_id=run_id)
        await store.cancel_run(run_id)
    clock.advance(100_000)  # far past the first windows
    newest = (START + 5000, "e")
    assert await newest_ended(store, None) == newest
    assert await newest_ended(store, (START, "a")) == newest
    assert await newest_ended(store, (START + 5000, "c")) == newest
    assert await newest_ended(store, newest) is None
    clock.advance(0.5)
    await client.submit("clit_index", {}, run_id="f")
    await store.cancel_run("f")
    assert await newest_ended(store, newest) == (START + 105_000.5, "f")
