"""``ResultSet(results)`` and ``allow_join_result()`` (``celery.result``), on a worker
running in this process (``start_worker``) over a SQLite store."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Celery
from pyrula_compat.contrib.testing.worker import start_worker
from pyrula_compat.result import (
    AsyncResult,
    GroupResult,
    ResultSet,
    allow_join_result,
    denied_join_result,
)

T = 30  # generous result timeout (seconds)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    db = Path(tmp_path_factory.mktemp("result-sets")) / "tasks.db"
    app = Celery("result_sets", broker=f"sqlite:///{db}", set_as_current=False)

    @app.task(name="rs.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="rs.fail")
    def fail() -> None:
        raise ValueError("no")

    @app.task(name="rs.joins")
    def joins(allow: bool) -> Any:
        inner = add.delay(2, 3)
        if not allow:
            return inner.get(timeout=T)  # refused: a task may not wait like this
        with allow_join_result():
            with denied_join_result(), pytest.raises(RuntimeError, match="Never call"):
                inner.get(timeout=T)
            return inner.get(timeout=T)

    with start_worker(app, concurrency=2):
        yield app


def test_a_result_set_waits_for_its_results_in_order(app: Celery) -> None:
    add = app.tasks["rs.add"]
    results = [add.delay(i, i) for i in range(3)]
    rs = ResultSet(results)
    assert len(rs) == 3 and list(rs) == results and rs[1] == results[1]
    assert rs.get(timeout=T) == [0, 2, 4] and rs.join(timeout=T) == [0, 2, 4]
    assert rs.ready() and rs.successful() and rs.completed_count() == 3
    rs.add(results[0])  # already there
    assert len(rs) == 3
    failed = app.tasks["rs.fail"].delay()
    rs.add(failed)
    with pytest.raises(ValueError, match="no"):
        rs.get(timeout=T)
    values = rs.get(timeout=T, propagate=False)
    assert values[:3] == [0, 2, 4] and isinstance(values[3], ValueError)
    assert rs.failed() and not rs.successful() and rs.completed_count() == 3
    rs.remove(failed.id)
    rs.discard(failed)  # gone already: no error
    with pytest.raises(KeyError):
        rs.remove(failed)
    rs.update([results[2], failed])
    assert [r.id for r in rs] == [r.id for r in results] + [failed.id]
    rs.clear()
    assert len(rs) == 0 and rs.get(timeout=T) == []


def test_a_result_set_with_a_callback_calls_it_for_each_result_instead(app: Celery) -> None:
    add = app.tasks["rs.add"]
    group = GroupResult("g-2", [add.delay(1, 1), add.delay(2, 2)])
    seen: list[Any] = []
    assert group.get(timeout=T, callback=lambda *a: seen.append(a)) == []  # Celery's join
    assert seen == [(group[0].id, 2), (group[1].id, 4)]


def test_a_group_result_is_a_result_set_with_an_id(app: Celery) -> None:
    add = app.tasks["rs.add"]
    results = [add.delay(1, 1), add.delay(2, 2)]
    group = GroupResult("g-1", results)
    assert isinstance(group, ResultSet) and group.id == "g-1" and group.results == results
    assert group.get(timeout=T) == [2, 4]
    assert group.as_tuple() == (("g-1", None), [r.as_tuple() for r in results])


def test_get_inside_a_task_needs_allow_join_result(app: Celery) -> None:
    joins = app.tasks["rs.joins"]
    assert joins.delay(True).get(timeout=T) == 5
    with pytest.raises(RuntimeError, match="allow_join_result"):
        joins.delay(False).get(timeout=T)
    assert isinstance(joins.delay(True), AsyncResult)


def test_maybe_throw_raises_a_failure_and_returns_a_value(app: Celery) -> None:
    ok = app.tasks["rs.add"].delay(1, 2)
    bad = app.tasks["rs.fail"].delay()
    assert ok.get(timeout=T) == 3
    seen: list[Any] = []
    assert ok.maybe_throw(callback=lambda task_id, value: seen.append((task_id, value))) == 3
    assert seen == [(ok.id, 3)]
    with pytest.raises(ValueError):
        bad.get(timeout=T)
    with pytest.raises(ValueError, match="no"):
        bad.maybe_reraise()
    assert isinstance(bad.maybe_throw(propagate=False), ValueError)


def test_a_saved_group_is_restored_by_id(app: Celery) -> None:
    from pyrula_compat import group

    add = app.tasks["rs.add"]
    saved = group(add.s(i, i) for i in range(4)).apply_async()
    saved.save()
    restored = GroupResult.restore(saved.id, app=app)
    assert isinstance(restored, GroupResult) and restored.id == saved.id
    assert [r.id for r in restored] == [r.id for r in saved]
    assert restored.get(timeout=T) == [0, 2, 4, 6] and restored.completed_count() == 4
    bound = app.GroupResult.restore(saved.id)  # the app's own class, as in Celery
    assert bound is not None and [r.id for r in bound] == [r.id for r in saved]
    assert isinstance(app.GroupResult("g", []), GroupResult)
    # Saved again with other members: replaced.
    other = app.GroupResult(saved.id, [add.delay(5, 5)])
    other.save()
    again = GroupResult.restore(saved.id, app=app)
    assert again is not None and again.get(timeout=T) == [10]
    other.delete()
    assert GroupResult.restore(saved.id, app=app) is None
    assert GroupResult.restore("never-saved", app=app) is None
