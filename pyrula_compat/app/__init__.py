"""``celery.app``: the app class, ``shared_task``, and the current/default app."""

from __future__ import annotations

from typing import Any

from pyrula_compat._state import get_current_app
from pyrula_compat.app.base import Celery
from pyrula_compat.app.registry import shared_task
from pyrula_compat.local import Proxy

current_app: Any = Proxy(get_current_app)
default_app: Any = Proxy(get_current_app)
App = Celery

__all__ = ["App", "Celery", "current_app", "default_app", "shared_task"]
