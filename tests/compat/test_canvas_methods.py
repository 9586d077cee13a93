"""Signature methods projects call besides ``delay``/``apply_async``: ``reprcall``,
``replace``, the list options, ``flatten_links``, ``parent_id``/``root_id``,
``AsyncResult``, ``register_type``/``TYPES``, ``chain.unchain_tasks``, ``group.skew``:
the same results as Celery 5.7's (``canvas_probe.py`` runs under both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyrula_compat import Celery, chain, group
from pyrula_compat.canvas import Signature
from pyrula_compat.contrib.abortable import AbortableAsyncResult, AbortableTask
from tests.compat.canvas_probe import probe
from tests.compat.real_celery import differences_from_celery

HERE = Path(__file__).resolve().parent


def test_the_methods_give_what_celerys_give() -> None:
    assert differences_from_celery(HERE / "canvas_probe.py", probe) == {}


def test_the_methods_stated() -> None:
    app = Celery("canvas_methods", broker="memory://", set_as_current=False)

    @app.task(name="cm.add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    sig = add.s(2)
    assert sig.reprcall(1) == "cm.add(1, 2)" and sig.replace(args=(5,)).args == (5,)
    assert sig.args == (2,)  # replace copies
    assert [t.options["countdown"] for t in group(add.s(1), add.s(2)).skew(start=3).tasks] == [
        3, 4,
    ]  # fmt: skip
    c = chain(add.s(1), add.s(2))
    c.link(add.s(3))
    assert [len(t.options.get("link") or []) for t in c.unchain_tasks()] == [0, 1]
    assert Signature.TYPES["chain"] is type(c) and Signature.TYPES["group"] is group
    assert Signature.from_dict(dict(c), app=app).tasks == c.tasks


def test_election_says_what_to_use_instead() -> None:
    app = Celery("canvas_methods", broker="memory://", set_as_current=False)
    sig = app.signature("cm.anything")
    with pytest.raises(NotImplementedError, match=r"election.*task_id"):
        sig.election()


def test_an_abortable_tasks_signature_gives_its_abortable_result() -> None:
    app = Celery("canvas_methods", broker="memory://", set_as_current=False)

    @app.task(bind=True, base=AbortableTask, name="cm.long")
    def long(self: AbortableTask) -> bool:
        return self.is_aborted()

    result = long.s().AsyncResult("some-id")
    assert isinstance(result, AbortableAsyncResult) and result.id == "some-id"
    assert not result.is_aborted()  # no such run: nothing asked it to stop
