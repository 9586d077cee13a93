"""The built-in ``celery.chunks`` task, as Celery registers it with ``celery.map`` and
``celery.starmap``: a ``chunks`` sent by name, or nested in a group, a chain or a chord
header, is one run of it, whose result is the chunks' list of lists. Eagerly and
against a real worker (SQLite and Valkey)."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula_compat import chain, chord, group, signature
from pyrula_compat.exceptions import ChordError
from pyrula_compat.result import AsyncResult, GroupResult
from tests.compat.conftest import Served

T = 30


@pytest.fixture
def add(app: Any) -> Any:
    @app.task
    def add(x, y):
        return x + y

    return add


def test_chunks_and_accumulate_are_built_in_tasks(app: Any) -> None:
    assert {"celery.chunks", "celery.map", "celery.starmap", "celery.accumulate"} <= set(
        app.tasks.keys()
    )
    accumulate = app.tasks["celery.accumulate"]
    assert accumulate.apply((1, 2, 3), {"index": 1}).get() == 2
    assert accumulate.apply((1, 2)).get() == (1, 2)  # eagerly the tuple, as in Celery


def test_chunks_by_name_and_nested_eagerly(app: Any, add: Any) -> None:
    kwargs = {"task": add.s(), "it": [[1, 2], [3, 4], [5, 6]], "n": 2}
    assert signature("celery.chunks", kwargs=kwargs, app=app).apply().get() == [[3, 7], [11]]
    assert app.tasks["celery.chunks"].apply(kwargs=kwargs).get() == [[3, 7], [11]]
    by_name = {**kwargs, "task": add.name}  # a task name works as well as a signature
    assert app.tasks["celery.chunks"].apply(kwargs=by_name).get() == [[3, 7], [11]]
    nested = group(add.chunks([(1, 1), (2, 2)], 1), add.s(3, 3), app=app).apply()
    assert nested.get() == [[[2], [4]], 6]


def test_a_chunks_in_a_group_freezes_as_one_task(app: Any, add: Any) -> None:
    c = add.chunks([(1, 1)], 1)
    frozen = c.freeze()
    assert isinstance(frozen, AsyncResult) and not isinstance(frozen, GroupResult)
    assert frozen.id == c.id and frozen.name == "celery.chunks"
    g = group(c, add.s(1, 2), app=app)
    assert g.freeze().results[0].id == frozen.id  # Celery's signature freeze: its own id


def test_celery_chunks_called_directly_queues_the_group(app: Any, add: Any) -> None:
    # Celery's body is chunks.apply_chunks(task, it, n): the group, called; eager here
    result = app.tasks["celery.chunks"](add.s(), [[1, 2], [3, 4]], 1)
    assert isinstance(result, GroupResult) and result.get() == [[3], [7]]


# -- on a worker ---------------------------------------------------------------------------
def tasks() -> Any:
    import proj.tasks

    return proj.tasks


def _kwargs(t: Any, items: list[list[Any]], n: int) -> dict[str, Any]:
    return {"task": t.add.s(), "it": items, "n": n}


@pytest.mark.slow
def test_chunks_sent_by_name_runs_on_a_worker(served: Served) -> None:
    t = tasks()
    kwargs = _kwargs(t, [[1, 2], [3, 4], [5, 6]], 2)
    result = served.app.send_task("celery.chunks", kwargs=kwargs)
    assert result.get(timeout=T) == [[3, 7], [11]]
    assert served.app.AsyncResult(result.id).name == "celery.chunks"
    again = signature("celery.chunks", kwargs=_kwargs(t, [[1, 1]], 5), app=served.app)
    assert again.delay().get(timeout=T) == [[2]]
    empty = served.app.send_task("celery.chunks", kwargs=_kwargs(t, [], 3))
    assert empty.get(timeout=T) == []


@pytest.mark.slow
def test_chunks_nested_in_a_group_a_chain_and_a_chord_header(served: Served) -> None:
    t = tasks()
    c = t.add.chunks([(1, 2), (3, 4), (5, 6)], 2)
    grouped = group(c, t.add.s(1, 1)).delay()
    assert grouped.get(timeout=T) == [[[3, 7], [11]], 2]
    assert grouped.results[0].get(timeout=T) == [[3, 7], [11]]  # its own run's result
    chained = group(t.add.chunks([(1, 2), (3, 4)], 1) | t.total.s(), t.add.s(2, 2)).delay()
    assert chained.get(timeout=T) == [10, 4]
    # the member ran as frozen: a chord (its chunks the header), the ids its result names
    header_results = chained.results[0].parent.results
    assert [r.get(timeout=T) for r in header_results] == [[3], [7]]
    header = chord([t.add.chunks([(1, 1), (2, 2)], 1), t.add.s(5, 5)], t.echo.s()).delay()
    assert header.get(timeout=T) == [[[2], [4]], 10]
    in_chain = chord([t.add.s(0, 1) | t.add.chunks([(3, 3)], 1)], t.echo.s()).delay()
    assert in_chain.get(timeout=T) == [[[6]]]  # immutable: the previous result not added
    assert c.apply_async().get(timeout=T) == [[3, 7], [11]]  # called: its GroupResult


@pytest.mark.slow
def test_a_chain_of_a_group_and_a_task_inside_a_group(served: Served) -> None:
    t = tasks()  # the chain is the chord its frozen result names (its tail once went unsent)
    nested = group(chain(group(t.add.s(1, 1), t.add.s(2, 2)), t.tsum.s()), t.add.s(1, 1))
    assert nested.delay().get(timeout=T) == [6, 2]


@pytest.mark.slow
def test_a_failing_chunk_fails_the_chunks_run_with_its_own_error(served: Served) -> None:
    t = tasks()
    kwargs = {"task": t.fail.s(), "it": [["first"], ["second"]], "n": 1}
    result = served.app.send_task("celery.chunks", kwargs=kwargs)
    with pytest.raises(t.ProjError, match="first"):  # as GroupResult.get() raises
        result.get(timeout=T)
    header = chord([t.fail.chunks([("boom",)], 1)], t.echo.s()).delay()
    with pytest.raises((ChordError, t.ProjError), match="boom"):
        header.get(timeout=T)
    with pytest.raises(ChordError, match="boom"):
        header.get(timeout=T, follow_parents=False)
