"""Process-wide state: the current and default app, shared tasks, the running task.

``current_app`` is the app created (or ``set_current``-ed) last; when none was ever
created, a default app is made on first use, so ``shared_task`` and ``current_app``
work in a project that never builds a ``Celery()``. ``current_task`` is the task whose
body runs in this thread, or None.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyrula_compat.local import Proxy

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.app.task import Task

_lock = threading.RLock()
_current_app: Celery | None = None
_default_app: Celery | None = None
_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
_shared_task_makers: list[Callable[[Celery], Any]] = []
_task_stack = threading.local()


def register_app(app: Celery) -> None:
    with _lock:
        _apps.add(app)
        for maker in list(_shared_task_makers):
            maker(app)


def set_current_app(app: Celery) -> None:
    global _current_app
    with _lock:
        _current_app = app


def set_default_app(app: Celery) -> None:
    global _default_app
    with _lock:
        _default_app = app


def get_current_app() -> Celery:
    """The current app; a default one (named ``default``) if no app exists yet."""
    global _current_app
    with _lock:
        if _current_app is not None:
            return _current_app
        if _default_app is not None:
            return _default_app
        from pyrula_compat.app.base import Celery

        app = Celery("default", set_as_current=False)
        set_default_app(app)
        return app


def all_apps() -> list[Celery]:
    with _lock:
        return list(_apps)


def connect_on_app_finalize(maker: Callable[[Celery], Any]) -> None:
    """Run ``maker(app)`` for every app that exists now and every app created later."""
    with _lock:
        _shared_task_makers.append(maker)
        apps = list(_apps)
    for app in apps:
        maker(app)


def push_task(task: Task) -> None:
    stack: list[Task] = _task_stack.__dict__.setdefault("stack", [])
    stack.append(task)


def pop_task() -> None:
    stack: list[Task] = _task_stack.__dict__.setdefault("stack", [])
    if stack:
        stack.pop()


def get_current_task() -> Task | None:
    """The task whose body runs in this thread, or None."""
    stack: list[Task] = _task_stack.__dict__.get("stack", [])
    return stack[-1] if stack else None


def get_current_worker_task() -> Task | None:
    """The innermost task run by a worker (not called directly) in this thread."""
    stack: list[Task] = _task_stack.__dict__.get("stack", [])
    for task in reversed(stack):
        if not task.request.called_directly:
            return task
    return None


current_app: Any = Proxy(get_current_app)
"""The current app (a default one when the project never created a ``Celery()``)."""
current_task: Any = Proxy(get_current_task)
"""The task whose body runs in this thread (falsy when none)."""
