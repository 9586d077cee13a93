"""``app.tasks`` and how a decorated function becomes a task (``celery.app.registry``)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from pyrula.workflows import Rate
from pyrula_compat import _state
from pyrula_compat.app.task import Task as TaskBase
from pyrula_compat.exceptions import ImproperlyConfigured, NotRegistered

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery


def parse_rate(value: Any) -> Rate | None:
    """Celery's ``"10/s"``, ``"100/m"``, ``"1000/h"`` or a number (per second)."""
    if value in (None, "", 0, "0"):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Rate(per_second=float(value))
    text = str(value).strip()
    count, _, unit = text.partition("/")
    seconds = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}.get(unit.strip()[:1] or "s")
    if seconds is None:
        raise ImproperlyConfigured(f"rate_limit {value!r}: expected N/s, N/m or N/h")
    per_second = float(count) / seconds
    return Rate(per_second=per_second) if per_second > 0 else None


class TaskRegistry(Mapping[str, TaskBase]):
    """``app.tasks``: name -> task. A missing name raises NotRegistered (a KeyError)."""

    def __init__(self) -> None:
        self._tasks: dict[str, TaskBase] = {}

    def __getitem__(self, name: str) -> TaskBase:
        try:
            return self._tasks[name]
        except KeyError:
            raise NotRegistered(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)

    def register(self, task: TaskBase) -> None:
        self._tasks[task.name] = task

    def unregister(self, name: str) -> None:
        self._tasks.pop(name, None)

    def regular(self) -> dict[str, TaskBase]:
        return {n: t for n, t in self._tasks.items() if not n.startswith("celery.")}


def build_task(
    fun: Callable[..., Any], name: str, base: type[TaskBase], bind: bool, options: Mapping[str, Any]
) -> TaskBase:
    """A Task subclass carrying ``options`` as class attributes, and its instance."""
    run = fun if bind else staticmethod(fun)
    attrs: dict[str, Any] = {
        "name": name,
        "run": run,
        "_decorated": True,
        "__doc__": fun.__doc__,
        "__module__": fun.__module__,
        "__qualname__": getattr(fun, "__qualname__", fun.__name__),
        "__wrapped__": fun,
        "__header__": _header(fun, bind),
        **options,
    }
    cls = type(fun.__name__, (base,), attrs)
    return cls()  # type: ignore[no-any-return]


def _header(fun: Callable[..., Any], bind: bool) -> Any:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def _django_apps() -> list[str]:
    try:
        from django.apps import apps
    except ImportError:
        return []
    if not apps.ready:
        return []
    return [config.name for config in apps.get_app_configs()]


def _import_if_exists(module: str) -> bool:
    from importlib.util import find_spec

    try:
        if find_spec(module) is None:
            return False
    except ModuleNotFoundError:
        return False
    importlib.import_module(module)
    return True


def shared_task(*args: Any, **options: Any) -> Any:
    """``@shared_task``: a task every app has (the current app's, when called)."""

    def create(fun: Callable[..., Any]) -> TaskBase:
        shared: list[TaskBase] = []

        def add_to(app: Celery) -> None:
            if shared:
                app.register_task(shared[0])
                return
            task = app._task_from_fun(fun, shared=True, **options)
            shared.append(task)

        _state.connect_on_app_finalize(add_to)
        if not shared:  # no app exists yet: the default app gets it
            add_to(_state.get_current_app())
        return shared[0]

    if len(args) == 1 and callable(args[0]) and not options:
        return create(args[0])
    return create
