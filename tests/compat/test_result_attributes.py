"""Every public attribute of Celery 5.7's ``AsyncResult``, ``GroupResult`` and
``EagerResult`` (read with ``dir()`` from an installed Celery in a subprocess) is there,
or raises AttributeError naming the Celery feature and what to use instead; and the
attributes the shim implements for them behave as Celery's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Celery, states
from pyrula_compat.exceptions import TimeoutError
from pyrula_compat.result import AsyncResult, EagerResult, GroupResult

CELERY57 = Path("/work/ref/celery57")
LIST = (
    "import json\n"
    "from celery.result import AsyncResult, EagerResult, GroupResult\n"
    "print(json.dumps({c.__name__: [n for n in dir(c) if not n.startswith('_')]\n"
    "                  for c in (AsyncResult, GroupResult, EagerResult)}))\n"
)


def celery_attributes() -> dict[str, list[str]]:
    if not (CELERY57 / "celery").is_dir():
        pytest.skip("Celery 5.7 is not installed at /work/ref/celery57")
    env = {**os.environ, "PYTHONPATH": str(CELERY57)}
    done = subprocess.run(
        [sys.executable, "-c", LIST], env=env, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    listed: dict[str, list[str]] = json.loads(done.stdout)
    return listed


@pytest.fixture
def app() -> Celery:
    app = Celery("attrs", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True
    return app


def test_every_celery_attribute_is_there_or_names_what_to_use(app: Celery) -> None:
    listed = celery_attributes()
    assert len(listed["AsyncResult"]) >= 40 and len(listed["GroupResult"]) >= 30
    instances: dict[str, Any] = {
        "AsyncResult": AsyncResult("a", app=app),
        "GroupResult": GroupResult("g", [AsyncResult("a", app=app)], app=app),
        "EagerResult": EagerResult("e", 1, states.SUCCESS),
    }
    unsupported: set[str] = set()
    for cls, names in listed.items():
        for name in names:
            try:
                getattr(instances[cls], name)
            except AttributeError as exc:
                assert "is not provided by pyrula_compat: " in str(exc), (cls, name, exc)
                assert str(exc).startswith(f"{cls}.{name} ("), exc
                unsupported.add(name)
    assert unsupported == {"then", "build_graph", "graph", "revoke_by_stamped_headers"}


def test_the_attributes_behave_as_celerys(app: Celery) -> None:
    first = AsyncResult("first", app=app)
    middle = AsyncResult("middle", app=app, parent=first)
    last = AsyncResult("last", app=app, parent=middle)
    assert last.as_list() == ["last", "middle", "first"]
    assert last.supports_native_join is True and last.TimeoutError is TimeoutError
    with pytest.raises(AttributeError, match=r"AsyncResult.then .* pass link="):
        last.then(print)
    assert not hasattr(last, "build_graph")

    @app.task(name="attrs.add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="attrs.boom")
    def boom() -> None:
        raise KeyError("boom")

    ok, failed = add.delay(1, 2), boom.delay()
    assert ok.get_leaf() == 3
    with pytest.raises(ValueError, match="given"):
        ok.throw(ValueError("given"))
    with pytest.raises(KeyError, match="boom"):
        failed.throw()
    group = GroupResult("grp", [ok, failed], app=app)
    assert group.app is app and group.backend is app.backend and group.supports_native_join
    seen: list[dict[str, Any]] = []
    native = list(group.iter_native(on_message=seen.append))
    assert [task_id for task_id, _ in native] == [ok.id, failed.id]
    assert native[0][1]["status"] == states.SUCCESS and native[0][1]["result"] == 3
    assert native[1][1]["status"] == states.FAILURE
    assert isinstance(native[1][1]["result"], KeyError) and seen == [m for _, m in native]
    with pytest.raises(KeyError, match="boom"):
        group.maybe_throw()
    values: list[Any] = []
    group.maybe_reraise(callback=lambda task_id, value: values.append(value), propagate=False)
    assert values[0] == 3 and isinstance(values[1], KeyError)
