"""``celery.app``: the app class, ``shared_task``, and the current/default app."""

from __future__ import annotations

from typing import Any

from pyrula_compat._state import get_current_app
from pyrula_compat.app.base import Celery
from pyrula_compat.app.current import (
    app_or_default,
    disable_trace,
    enable_trace,
    pop_current_task,
    push_current_task,
)
from pyrula_compat.app.registry import shared_task
from pyrula_compat.app.utils import bugreport
from pyrula_compat.local import Proxy

current_app: Any = Proxy(get_current_app)
default_app: Any = Proxy(get_current_app)
App = Celery

__all__ = [
    "App",
    "Celery",
    "app_or_default",
    "bugreport",
    "current_app",
    "default_app",
    "disable_trace",
    "enable_trace",
    "pop_current_task",
    "push_current_task",
    "shared_task",
]
