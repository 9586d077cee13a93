"""``chunks``, ``xmap`` and ``xstarmap`` as Celery has them: each chunk is one
``celery.starmap`` task; map and starmap are one task over the whole list. Eagerly and
against a real worker (SQLite and Valkey)."""

from __future__ import annotations

from typing import Any

import pytest

from pyrula_compat import chunks, group, xmap, xstarmap
from pyrula_compat.canvas import Signature
from pyrula_compat.result import GroupResult
from tests.compat.conftest import Served

T = 30


@pytest.fixture
def add(app: Any) -> Any:
    calls: list[tuple[int, int]] = []

    @app.task
    def add(x, y):
        calls.append((x, y))
        return x + y

    add.calls = calls
    return add


def test_chunks_is_a_signature_whose_group_has_one_starmap_task_per_chunk(add: Any) -> None:
    c = add.chunks(zip(range(10), range(10), strict=True), 4)
    assert isinstance(c, chunks) and c.task == "celery.chunks" and c.immutable
    assert c.kwargs["n"] == 4 and c.kwargs["it"][:2] == [[0, 0], [1, 1]]
    g = c.group()
    assert isinstance(g, group) and len(g) == 3
    assert all(isinstance(member, xstarmap) for member in g.tasks)
    assert [m.kwargs["it"] for m in g.tasks][-1] == [[8, 8], [9, 9]]
    assert {m.task for m in g.tasks} == {"celery.starmap"}
    assert repr(g.tasks[0]).startswith(f"[{add.name}(*x) for x in [[0, 0]")


def test_chunks_results_are_one_list_per_chunk_eagerly(add: Any) -> None:
    c = add.chunks(zip(range(10), range(10), strict=True), 4)
    expected = [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
    result = c.apply_async()
    assert isinstance(result, GroupResult) and len(result) == 3
    assert result.get() == expected
    assert c.delay().get() == expected and c().get() == expected and c.apply().get() == expected
    assert chunks(add.s(), [(1, 2)], 5).apply_async().get() == [[3]]


def test_chunks_of_nothing_is_an_empty_group(add: Any) -> None:
    result = add.chunks([], 3).apply_async()
    assert isinstance(result, GroupResult) and result.results == [] and result.get() == []
    assert add.calls == []


def test_chunks_round_trips_as_a_dict_and_pipes_into_a_task(app: Any, add: Any) -> None:
    @app.task
    def total(lists):
        return sum(sum(part) for part in lists)

    c = add.chunks([(1, 2), (3, 4), (5, 6)], 2)
    again = Signature.from_dict(c.as_json(), app)
    assert isinstance(again, chunks) and again.group().apply().get() == [[3, 7], [11]]
    assert (c | total.s()).delay().get() == 21  # a chunks then a task: a chord, as a group
    with pytest.raises(ValueError):
        add.chunks([(1, 2)], 0)


def test_map_and_starmap_are_one_immutable_task_over_the_list(app: Any, add: Any) -> None:
    @app.task
    def double(x):
        return 2 * x

    m, s = double.map([1, 2, 3]), add.starmap([(1, 2), (3, 4)])
    assert isinstance(m, xmap) and isinstance(s, xstarmap) and m.immutable and s.immutable
    assert m.task == "celery.map" and m.kwargs == {"task": double.name, "it": [1, 2, 3]}
    assert m.delay().get() == [2, 4, 6] and s.delay().get() == [3, 7]
    assert (add.s(1, 1) | double.map([5])).delay().get() == [10]  # no previous result added
    assert isinstance(Signature.from_dict(s.as_json(), app), xstarmap)
    assert repr(m) == f"[{double.name}(x) for x in [1, 2, 3]]"


# -- on a worker ---------------------------------------------------------------------------
def tasks() -> Any:
    import proj.tasks

    return proj.tasks


@pytest.mark.slow
def test_chunks_on_a_worker(served: Served) -> None:
    t = tasks()
    result = t.add.chunks(zip(range(10), range(10), strict=True), 4).apply_async()
    assert isinstance(result, GroupResult) and len(result.results) == 3
    assert result.get(timeout=T) == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
    assert {member.name for member in result.results} == {"celery.starmap"}  # one run a chunk
    assert t.add.chunks([], 4).delay().get(timeout=T) == []
    piped = (t.add.chunks([(1, 2), (3, 4), (5, 6)], 2) | t.total.s()).delay()
    assert piped.get(timeout=T) == 21


@pytest.mark.slow
def test_map_and_starmap_on_a_worker(served: Served) -> None:
    t = tasks()
    starmap = t.add.starmap([(1, 2), (3, 4)]).delay()
    assert starmap.get(timeout=T) == [3, 7] and starmap.name == "celery.starmap"
    assert t.tsum.map([[1, 2], [3]]).delay().get(timeout=T) == [3, 3]
    assert (t.add.s(1, 1) | t.tsum.map([[1, 2]])).delay().get(timeout=T) == [3]
