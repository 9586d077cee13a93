"""Task attributes that read the app's settings when the task leaves them None.

Celery's ``Task.bind`` copies ``task_serializer``, ``task_acks_late``,
``task_ignore_result``, ... (``Task.from_config``) and ``app.strict_typing`` into the
task attributes left None, so a bound task reads ``add.acks_late`` as the app's
setting. Here each such attribute of :class:`~pyrula_compat.app.task.Task` is a
:class:`FromConfig` descriptor that reads the setting when it is read: the value
Celery's ``bind`` would copy, and a later ``app.conf`` change is seen (the shim reads
every setting when it is used). A decorator option, a class attribute of a subclass,
an annotation or an assignment to the task wins, as in Celery.
"""

from __future__ import annotations

from typing import Any

FROM_CONFIG: tuple[tuple[str, str], ...] = (
    ("serializer", "task_serializer"),
    ("rate_limit", "task_default_rate_limit"),
    ("priority", "task_default_priority"),
    ("time_limit", "task_time_limit"),
    ("soft_time_limit", "task_soft_time_limit"),
    ("track_started", "task_track_started"),
    ("acks_late", "task_acks_late"),
    ("acks_on_failure_or_timeout", "task_acks_on_failure_or_timeout"),
    ("acks_on_failure", "task_acks_on_failure"),
    ("acks_on_timeout", "task_acks_on_timeout"),
    ("reject_on_worker_lost", "task_reject_on_worker_lost"),
    ("retry_on_worker_lost", "task_retry_on_worker_lost"),
    ("ignore_result", "task_ignore_result"),
    ("store_eager_result", "task_store_eager_result"),
    ("store_errors_even_if_ignored", "task_store_errors_even_if_ignored"),
)
"""Task attribute -> the setting it reads when left None (Celery's ``from_config``)."""
STRICT_TYPING = ""
"""The "setting" of ``typing``: the app's ``strict_typing`` argument."""
ACKS_BOTH = ("acks_on_failure", "acks_on_timeout")
"""Left None by their settings too, they read ``acks_on_failure_or_timeout`` (True when
that is None), as Celery's ``bind`` sets them."""


class FromConfig:
    """A task attribute that reads ``setting`` from the task's app; None on the class."""

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, task: Any, owner: type | None = None) -> Any:
        if task is None:
            return None
        app = task.app
        if self.setting == STRICT_TYPING:
            return getattr(app, "strict_typing", True)
        conf = app.conf
        if not conf.configured:
            conf.load()  # as Celery binds a task on first use: annotations apply first
            if self.name in vars(task):
                return vars(task)[self.name]
        value = conf[self.setting]
        if value is None and self.name in ACKS_BOTH:
            both = task.acks_on_failure_or_timeout
            return True if both is None else both
        return value

    def __repr__(self) -> str:
        return f"<from config: {self.setting or 'strict_typing'}>"


def from_config(setting: str) -> Any:
    """The class attribute reading ``setting`` (``STRICT_TYPING`` for ``typing``)."""
    return FromConfig(setting)


ATTRIBUTES = ("typing", *(name for name, _ in FROM_CONFIG))


def own_value(task: Any, name: str) -> Any:
    """``task``'s own ``name`` (its instance's, else its class's), None when only the
    app's setting gives one: read without loading the configuration."""
    if name in vars(task):
        return vars(task)[name]
    for klass in type(task).__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return None if isinstance(value, FromConfig) else value
    return None


def fill_from_config(task: Any) -> None:
    """A class of ``task`` that sets one of these attributes to None explicitly (a
    decorator option ``=None``, a base class's ``acks_late = None``) reads the setting
    then too, as Celery's ``bind`` fills it: the task's class gets the descriptor."""
    cls = type(task)
    for name in ATTRIBUTES:
        for klass in cls.__mro__:
            if name in vars(klass):
                if vars(klass)[name] is None:
                    found = (vars(k).get(name) for k in cls.__mro__)
                    descriptor = next((d for d in found if isinstance(d, FromConfig)), None)
                    if descriptor is not None:
                        setattr(cls, name, descriptor)
                break


__all__ = ["FROM_CONFIG", "STRICT_TYPING", "FromConfig", "fill_from_config", "own_value"]
