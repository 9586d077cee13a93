"""A Task base class as real projects write one (Flask's ContextTask, a singleton base,
hooks), through every way a task is called: eagerly, ``delay``, ``apply_async``,
signatures, chain, group, chord, and a worker (``start_worker``, the ``celery_worker``
fixture's worker, on a thread of this process); ``mock.patch`` of ``Task.retry``; the
Task attributes Celery has and a durable store cannot."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from pyrula_compat import Celery, chain, chord, group
from pyrula_compat.app.task import Task
from pyrula_compat.contrib.testing.worker import start_worker
from pyrula_compat.exceptions import Retry

T = 30


class Contexts:
    """A stand-in for Flask's ``app.app_context()``: records what ran inside it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = threading.local()
        self.entered: list[Any] = []

    @contextlib.contextmanager
    def app_context(self) -> Iterator[None]:
        self.active.on = True
        try:
            yield
        finally:
            self.active.on = False

    def inside(self) -> bool:
        return bool(getattr(self.active, "on", False))


def make_app(eager: bool) -> tuple[Celery, Contexts, dict[str, list[Any]]]:
    """Flask's ``make_celery()``: ``celery.Task = ContextTask`` before the tasks."""
    flask = Contexts()
    seen: dict[str, list[Any]] = {"body": [], "hooks": []}
    celery = Celery("ctxproj", broker="memory://", set_as_current=False)
    celery.conf.task_always_eager = eager

    class ContextTask(celery.Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with flask.app_context():
                return self.run(*args, **kwargs)

        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            seen["hooks"].append(("before_start", task_id, list(args), dict(kwargs)))

        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
            seen["hooks"].append(("on_success", retval, task_id, list(args), dict(kwargs)))

        def on_failure(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            seen["hooks"].append(
                ("on_failure", repr(exc), task_id, list(args), einfo.exception is exc)
            )

        def on_retry(self, exc: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
            seen["hooks"].append(
                ("on_retry", repr(exc), task_id, list(args), type(einfo.exception).__name__)
            )

        def after_return(self, status: str, retval: Any, *rest: Any) -> None:
            task_id, _args, _kwargs, einfo = rest
            seen["hooks"].append(("after_return", status, repr(retval), task_id, einfo))

    celery.Task = ContextTask

    @celery.task(name="ctx.add", bind=True)
    def add(self: Task, x: int, y: int) -> int:
        seen["body"].append((self.request.id, flask.inside(), self.request.called_directly))
        return x + y

    @celery.task(name="ctx.boom")
    def boom(x: int) -> int:
        raise ValueError(f"boom {x}")

    @celery.task(name="ctx.flaky", bind=True, max_retries=1, default_retry_delay=0)
    def flaky(self: Task, x: int) -> int:
        if self.request.retries == 0:
            raise self.retry(exc=ConnectionError("down"), countdown=0)
        return x

    return celery, flask, seen


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "worker"])
def test_context_task_runs_every_call_inside_its_context(eager: bool) -> None:
    app, _flask, seen = make_app(eager)
    add = app.tasks["ctx.add"]
    assert isinstance(add, app.Task) and add.app is app and type(add).app is app
    with contextlib.ExitStack() as stack:
        if not eager:
            stack.enter_context(start_worker(app, perform_ping_check=False))
        assert add.delay(1, 2).get(timeout=T) == 3
        assert add.apply_async((2, 3), task_id=f"fixed-{eager}").get(timeout=T) == 5
        assert add.s(3, 4).delay().get(timeout=T) == 7
        assert chain(add.s(1, 1), add.s(10)).delay().get(timeout=T) == 12
        assert group(add.s(1, 1), add.s(2, 2)).delay().get(timeout=T) == [2, 4]
        assert chord([add.s(1, 1), add.s(2, 2)], add.si(5, 5)).delay().get(timeout=T) == 10
    # 1 + 1 + 1 + 2 (chain) + 2 (group) + 3 (chord header and body) bodies
    assert len(seen["body"]) == 10
    assert all(inside for _, inside, _ in seen["body"])
    assert all(not direct and task_id for task_id, _, direct in seen["body"])
    assert f"fixed-{eager}" in [task_id for task_id, _, _ in seen["body"]]
    assert add(5, 5) == 10  # called directly: through __call__ too
    assert seen["body"][-1][1:] == (True, True)


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "worker"])
def test_hooks_get_celerys_arguments(eager: bool) -> None:
    app, _flask, seen = make_app(eager)
    with contextlib.ExitStack() as stack:
        if not eager:
            stack.enter_context(start_worker(app, perform_ping_check=False))
        ok = app.tasks["ctx.add"].apply_async((2, 3), task_id=f"ok-{eager}")
        assert ok.get(timeout=T) == 5
        failed = app.tasks["ctx.boom"].apply_async((7,), task_id=f"bad-{eager}")
        with pytest.raises(ValueError, match="boom 7"):
            failed.get(timeout=T)
        retried = app.tasks["ctx.flaky"].apply_async((9,), task_id=f"retry-{eager}")
        assert retried.get(timeout=T) == 9
    by_task: dict[str, list[Any]] = {}
    for hook in seen["hooks"]:
        task_id = next(v for v in hook if isinstance(v, str) and "-" in v and v[0] in "obr")
        by_task.setdefault(task_id.split("-")[0], []).append(hook)
    assert by_task["ok"] == [
        ("before_start", f"ok-{eager}", [2, 3], {}),
        ("on_success", 5, f"ok-{eager}", [2, 3], {}),
        ("after_return", "SUCCESS", "5", f"ok-{eager}", None),
    ]
    assert by_task["bad"] == [
        ("before_start", f"bad-{eager}", [7], {}),
        ("on_failure", "ValueError('boom 7')", f"bad-{eager}", [7], True),
        ("after_return", "FAILURE", "ValueError('boom 7')", f"bad-{eager}", None),
    ]
    # The retry: on_retry gets the exception given to retry() and the Retry's einfo;
    # no after_return for the retried attempt, as in Celery.
    assert by_task["retry"] == [
        ("before_start", f"retry-{eager}", [9], {}),
        ("on_retry", "ConnectionError('down')", f"retry-{eager}", [9], "Retry"),
        ("before_start", f"retry-{eager}", [9], {}),
        ("on_success", 9, f"retry-{eager}", [9], {}),
        ("after_return", "SUCCESS", "9", f"retry-{eager}", None),
    ]


def test_subclass_apply_async_choosing_the_task_id_is_honoured() -> None:
    """A singleton base: one id per arguments, chosen in an apply_async override; delay,
    signatures and a worker go through it."""
    app = Celery("singleton", broker="memory://", set_as_current=False)
    sent: list[str] = []

    class Singleton(app.Task):
        def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
            task_id = f"{self.name}:{'-'.join(map(str, args or ()))}"
            sent.append(task_id)
            return super().apply_async(args, kwargs, task_id=task_id, **options)

    @app.task(base=Singleton, name="single.double")
    def double(x: int) -> int:
        return 2 * x

    with start_worker(app, perform_ping_check=False):
        first = double.delay(21)
        assert first.id == "single.double:21" and first.get(timeout=T) == 42
        assert double.s(21).apply_async().id == "single.double:21"  # the same run
        assert double.apply_async((4,)).get(timeout=T) == 8
    assert sent == ["single.double:21", "single.double:21", "single.double:4"]
    with pytest.raises(TypeError, match=r"base=<class 'dict'>"):
        app.task(base=dict)(lambda: None)


def test_mock_patch_of_task_retry_reaches_bound_tasks() -> None:
    app = Celery("retrying", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(bind=True, name="r.fetch")
    def fetch(self: Task, url: str) -> str:
        try:
            raise ConnectionError(url)
        except ConnectionError as exc:
            raise self.retry(exc=exc, countdown=5) from exc

    with mock.patch("pyrula_compat.app.task.Task.retry") as retry:
        retry.side_effect = Retry("patched")
        with pytest.raises(Retry):
            fetch.apply(("http://x",), throw=True)
        assert retry.call_count >= 1
        called = retry.call_args
        assert isinstance(called.kwargs["exc"], ConnectionError)
        assert called.kwargs["countdown"] == 5


def test_app_task_is_bound_and_checked() -> None:
    app = Celery("bases", broker="memory://", set_as_current=False)
    assert issubclass(app.Task, Task) and app.Task.app is app
    by_path = Celery(
        "bypath", broker="memory://", set_as_current=False,
        task_cls="tests.compat.test_task_subclass:Audited",
    )  # fmt: skip
    assert issubclass(by_path.Task, Audited)

    @by_path.task(name="bases.noop")
    def noop() -> None:
        return None

    assert ("noop", by_path) in BOUND
    with pytest.raises(TypeError, match=r"app.Task=<class 'object'>: a task base class"):
        app.Task = object  # type: ignore[assignment]
    with pytest.raises(TypeError, match="task_cls=<class 'int'>"):
        Celery("bad", task_cls=int, set_as_current=False)  # type: ignore[arg-type]


BOUND: list[Any] = []


class Audited(Task):
    """The base ``task_cls`` names by path in the test above; records its bindings."""

    @classmethod
    def on_bound(cls, app: Any) -> None:
        BOUND.append((cls.__name__, app))


def test_attributes_without_a_broker_name_the_feature_and_the_way_instead() -> None:
    app = Celery("broker", broker="memory://", set_as_current=False)
    task = app.task(lambda: None, name="b.noop")
    with pytest.raises(AttributeError, match=r"Task.Strategy is the worker's consumer"):
        type(task).Strategy  # noqa: B018
    with pytest.raises(AttributeError, match=r"add_to_chord .*build the whole header"):
        task.add_to_chord(task.s())
    assert not hasattr(task, "start_strategy")
    with pytest.raises(AttributeError, match=r"Celery.connection_for_write is a kombu"):
        app.connection_for_write()
    assert not hasattr(app, "amqp")
    # What Celery's classes have, implemented: a sample.
    assert task.from_config[0] == ("serializer", "task_serializer")
    assert task.shadow_name((), {}, {}) is None
    assert task.signature_from_request(task.request).task == "b.noop"
    assert app.either("task_default_queue", "x") == "celery"
    assert app.loader.app is app and isinstance(app.oid, str)
    assert app.steps["worker"] == set() and app.user_options["worker"] == set()


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "worker"])
def test_shadow_name_reaches_the_request(eager: bool) -> None:
    app = Celery("shadows", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = eager

    class Shadowed(app.Task):
        def shadow_name(self, args: Any, kwargs: Any, options: Any) -> str:
            return f"report for {args[0]}"

    @app.task(base=Shadowed, bind=True, name="s.report")
    def report(self: Task, who: str) -> Any:
        return self.request.shadow

    with contextlib.ExitStack() as stack:
        if not eager:
            stack.enter_context(start_worker(app, perform_ping_check=False))
        assert report.delay("ann").get(timeout=T) == "report for ann"
        assert report.apply_async(("bo",), shadow="mine").get(timeout=T) == "mine"


def test_a_custom_loader_gets_the_worker_hooks() -> None:
    from pyrula_compat.loaders.base import BaseLoader

    calls: list[str] = []

    class Loader(BaseLoader):
        def on_worker_init(self) -> None:
            calls.append("init")

        def on_worker_shutdown(self) -> None:
            calls.append("shutdown")

    app = Celery("loading", broker="memory://", loader=Loader, set_as_current=False)
    assert isinstance(app.loader, Loader) and app.loader.app is app
    with start_worker(app, perform_ping_check=False):
        assert calls == ["init"]
    assert calls == ["init", "shutdown"]
    assert app.loader.cmdline_config_parser(["celery.task_always_eager=(bool)1"]) == {
        "task_always_eager": True
    }
