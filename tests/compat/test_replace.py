"""``Task.replace(sig)``: eagerly, against a real worker (SQLite and Valkey), and with the
worker SIGKILLed after the replacement was decided and after it was started."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Task, chain, chord, group, states
from pyrula_compat.exceptions import ChordError, ImproperlyConfigured
from tests.compat.conftest import Served, Workers, broker_url, lines, proj_workers, wait_until

T = 30  # generous result timeout (seconds)


def tasks() -> Any:  # the project's own module, imported as the worker imports it
    import proj.tasks

    return proj.tasks


# -- eager ---------------------------------------------------------------------------------
@pytest.fixture
def eager(app: Any) -> Any:
    calls: list[Any] = []

    class Hooked(Task):
        def on_replace(self, sig: Any) -> Any:
            calls.append(("on_replace", sig.task))
            return super().on_replace(sig)

    @app.task
    def add(x, y):
        return x + y

    @app.task
    def boom(message):
        raise KeyError(message)

    @app.task(bind=True, base=Hooked)
    def swap(self, kind, value):
        calls.append(("body", self.request.id))
        sigs = {
            "task": add.s(value, 1),
            "chain": add.s(value, 1) | add.s(10),
            "group": group(add.s(value, 1), add.s(value, 2)),
            "fail": boom.s("nope"),
            "empty": chain(),
            "nothing": group(),
            "chunks": add.chunks([(value, 1), (value, 2)], 1),
        }
        self.replace(sigs[kind])
        calls.append("after replace")  # never runs
        return "not replaced"

    class Tasks:
        pass

    ns = Tasks()
    ns.add, ns.swap, ns.calls = add, swap, calls  # type: ignore[attr-defined]
    return ns


def test_eager_replace_gives_the_replacements_result(eager: Any) -> None:
    assert eager.swap.delay("task", 5).get() == 6
    assert eager.swap.delay("chain", 5).get() == 16
    assert eager.swap.apply(("task", 1)).get() == 2  # apply() is eager too
    assert "after replace" not in eager.calls
    assert eager.calls.count(("on_replace", eager.add.name)) == 2
    assert ("on_replace", "celery.chain") in eager.calls


def test_eager_replace_with_a_group_gives_the_list(eager: Any) -> None:
    result = eager.swap.delay("group", 5)
    assert result.state == states.SUCCESS and result.get() == [6, 7]


def test_eager_replace_with_an_empty_group_or_chunks(eager: Any) -> None:
    assert eager.swap.delay("nothing", 5).get() == []  # Celery's chord of nothing: []
    assert eager.swap.delay("chunks", 5).get() == [[6], [7]]


def test_eager_failing_replacement_fails_the_task(eager: Any) -> None:
    result = eager.swap.delay("fail", 5)
    assert result.state == states.FAILURE and isinstance(result.result, KeyError)
    with pytest.raises(KeyError, match="nope"):
        result.get()


def test_eager_replace_with_an_empty_chain_is_improperly_configured(eager: Any) -> None:
    result = eager.swap.delay("empty", 5)
    assert isinstance(result.result, ImproperlyConfigured)
    assert "empty chain" in str(result.result)


def test_eager_replace_inside_a_chain_continues_the_chain(eager: Any) -> None:
    assert (eager.swap.s("task", 5) | eager.add.s(100)).delay().get() == 106


def test_replace_called_directly_queues_the_signature_and_stops(app: Any) -> None:
    from pyrula_compat.exceptions import Ignore

    sent: list[Any] = []

    @app.task
    def add(x, y):
        return x + y

    @app.task(bind=True)
    def swap(self):
        self.replace(add.s(1, 2))

    add.apply_async = lambda *a, **kw: sent.append((a, kw))  # type: ignore[method-assign]
    with pytest.raises(Ignore):
        swap()  # no worker, not eager: Celery's sig.delay() and Ignore
    assert sent and sent[0][0][0] == (1, 2)


# -- on a worker ---------------------------------------------------------------------------
pytest_slow = pytest.mark.slow


@pytest_slow
def test_replace_with_a_task_resolves_the_original_id(served: Served) -> None:
    t, marker = tasks(), served.path("marker")
    result = t.replace_with.delay("task", 5, marker)
    assert result.get(timeout=T) == 6
    assert result.state == states.SUCCESS
    assert served.app.AsyncResult(result.id).get(timeout=T) == 6
    assert lines(marker) == [f"replace {served.worker.proc.pid} 0"]  # ran once, stopped


@pytest_slow
def test_replace_with_a_chain_and_a_group(served: Served) -> None:
    t = tasks()
    assert t.replace_with.delay("chain", 5).get(timeout=T) == 60  # (5 + 1) * 10
    # a group gives the list of its results; a chain inside it runs in turn
    assert t.replace_with.delay("group", 5).get(timeout=T) == [6, 10, 15]
    assert t.replace_with.delay("nothing", 5).get(timeout=T) == []


@pytest_slow
def test_failing_replacement_fails_the_original_with_its_error(served: Served) -> None:
    t = tasks()
    result = t.replace_with.delay("fail", 7)
    with pytest.raises(t.ProjError, match="replacement of 7 failed"):
        result.get(timeout=T)
    assert result.state == states.FAILURE
    assert "ProjError" in (result.traceback or "")
    # the rest of a chain fails with the same error
    tail = (t.replace_with.s("fail", 8) | t.add.s(1)).delay()
    with pytest.raises(t.ProjError, match="replacement of 8 failed"):
        tail.get(timeout=T)


@pytest_slow
def test_replace_inside_a_chain_continues_the_chain(served: Served) -> None:
    t = tasks()
    result = (t.replace_with.s("task", 5) | t.add.s(100) | t.mul.s(2)).delay()
    assert result.get(timeout=T) == 212  # ((5 + 1) + 100) * 2
    assert result.parent.get(timeout=T) == 106 and result.parent.parent.get(timeout=T) == 6
    longer = (t.replace_with.s("chain", 1) | t.add.s(1)).delay()
    assert longer.get(timeout=T) == 21  # the replacing chain, then the rest


@pytest_slow
def test_replace_keeps_links_and_works_in_a_chord_header(served: Served) -> None:
    t, path = tasks(), served.path("links")
    result = t.replace_with.apply_async(("task", 2), link=t.record.s(path))
    assert result.get(timeout=T) == 3
    wait_until(lambda: lines(path) == ["3"], T, "the link to get the replacement's result")
    both = chord([t.replace_with.s("task", 1), t.add.s(1, 1)], t.tsum.s()).delay()
    assert both.get(timeout=T) == 4


@pytest_slow
def test_replace_by_a_task_that_replaces_itself_counts_the_nesting(served: Served) -> None:
    t, marker = tasks(), served.path("nested")
    assert t.replace_with.delay("again", 7, marker).get(timeout=T) == 8
    assert [line.split()[-1] for line in lines(marker)] == ["0", "1"]


@pytest_slow
def test_group_replacement_with_a_failing_member_is_a_chord_error(served: Served) -> None:
    t = tasks()
    result = t.replace_with.delay("group", "x")  # mul("x", 2) works, add("x", 1) fails
    with pytest.raises(ChordError, match=r"proj\.tasks\.add"):
        result.get(timeout=T)


# -- a worker killed mid-replacement ---------------------------------------------------------
@pytest.fixture(params=["sqlite", "valkey"])
def workers(request: pytest.FixtureRequest, tmp_path: Path, proj_app: Any) -> Any:
    with proj_workers(broker_url(request.param, tmp_path, request), tmp_path, proj_app) as group:
        yield group


def _starts(marker: str) -> list[list[str]]:
    return [line.split() for line in lines(marker) if line.startswith("start")]


@pytest_slow
def test_worker_killed_before_the_replacement_starts_it_once_elsewhere(workers: Workers) -> None:
    """The worker dies (SIGKILL, at the engine's fault point) right after the body's
    replace outcome is journaled, before the replacement is started: the next worker
    does not run the body again and starts the replacement once."""
    t = tasks()
    marker, gate = str(workers.tmp / "marker"), str(workers.tmp / "gate")
    first = workers.start(env={"PYRULA_FAULTPOINTS": "after_journal_before_reply=kill"})
    result = t.replace_with.delay("gate", gate, marker)
    wait_until(lambda: first.proc.poll() is not None, T, "the first worker to die")
    assert first.proc.returncode == -9
    assert lines(marker) == [f"replace {first.proc.pid} 0"]  # decided, not started
    second = workers.start()
    wait_until(lambda: _starts(marker), T, "the replacement to start")
    Path(gate).touch()
    child_id = result.get(timeout=T)
    assert child_id.startswith(f"{result.id}.")  # a child run of the original
    assert [line for line in lines(marker) if line.startswith("replace")] == [
        f"replace {first.proc.pid} 0"
    ]
    assert _starts(marker) == [["start", str(second.proc.pid), child_id]]


@pytest_slow
def test_worker_sigkilled_while_the_replacement_runs_does_not_start_it_twice(
    workers: Workers,
) -> None:
    t = tasks()
    marker, gate = str(workers.tmp / "marker"), str(workers.tmp / "gate")
    first = workers.start()
    result = t.replace_with.delay("gate", gate, marker)
    wait_until(lambda: _starts(marker), T, "the replacement to start on the first worker")
    first.kill()  # SIGKILL by pid, mid-replacement
    second = workers.start()
    wait_until(lambda: len(_starts(marker)) == 2, T, "the replacement to resume elsewhere")
    Path(gate).touch()
    child_id = result.get(timeout=T)
    starts = _starts(marker)
    # one replacement run, taken over by the second worker; the body ran once
    assert [s[2] for s in starts] == [child_id, child_id]
    assert [s[1] for s in starts] == [str(first.proc.pid), str(second.proc.pid)]
    assert len([line for line in lines(marker) if line.startswith("replace")]) == 1
    assert os.path.exists(gate)


@pytest_slow
def test_a_replacements_own_link_runs_with_its_result(served: Served) -> None:
    t, path = tasks(), served.path("own-link")
    result = t.replace_with.delay("linked", 4, path)
    assert result.get(timeout=T) == 5
    wait_until(lambda: "5" in lines(path), T, "the replacement's own link")


@pytest_slow
def test_replace_with_chunks_piped_into_a_task(served: Served) -> None:
    # (4+1) + (4+2) in one chunk, (4+3) in the other; total sums the lists of lists
    assert tasks().replace_with.delay("chunks", 4).get(timeout=T) == 18


@pytest_slow
def test_replace_with_chunks_gives_its_list_of_lists(served: Served) -> None:
    assert tasks().replace_with.delay("chunks_alone", 4).get(timeout=T) == [[5, 6], [7]]


@pytest_slow
def test_a_replacement_with_a_task_id_of_its_own_resolves_under_both_ids(served: Served) -> None:
    """Celery freezes the replacement with the replaced task's id only when it has none,
    so a task id set on it names its result: here both ids do (the replaced task's id
    always does)."""
    t, app = tasks(), served.app
    result = t.replace_with.delay("own_id", 5)
    assert result.get(timeout=T) == 6
    own = app.AsyncResult(f"{result.id}-own")
    assert own.get(timeout=T) == 6 and own.state == states.SUCCESS
    assert t.replace_with.delay("own_id_same", 5).get(timeout=T) == 6  # its own run's id
    grouped = t.replace_with.delay("own_id_group", 5)
    assert grouped.get(timeout=T) == [6, 10]
    assert app.AsyncResult(f"{grouped.id}-own").get(timeout=T) == 6
    chained = t.replace_with.delay("own_id_chain", 5)  # add(5, 1) | fail(6)
    with pytest.raises(t.ProjError, match="6"):
        chained.get(timeout=T)
    assert app.AsyncResult(f"{chained.id}-own").get(timeout=T) == 6
    failed = app.AsyncResult(f"{chained.id}-own2")
    with pytest.raises(t.ProjError, match="6"):
        failed.get(timeout=T)
    assert failed.state == states.FAILURE
