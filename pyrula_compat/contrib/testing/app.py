"""``celery.contrib.testing.app``: test apps, and a trap for code that falls back to
the current app.

``TestApp()`` is an app on an in-process store (``memory://``) with Celery's test
settings. ``set_trap(app)`` makes the current and default app a :class:`Trap` while
its block runs, so code that uses ``current_app`` instead of the app it was given
fails with ``RuntimeError("Test depends on current_app")``. ``setup_default_app(app)``
restores the current and default app when its block ends (closing ``app`` if it was
not the current one).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from copy import deepcopy
from typing import Any

from pyrula_compat import _state
from pyrula_compat.app.base import Celery
from pyrula_compat.app.log import Logging

DEFAULT_TEST_CONFIG: dict[str, Any] = {
    "worker_hijack_root_logger": False,
    "worker_log_color": False,
    "accept_content": {"json"},
    "enable_utc": True,
    "timezone": "UTC",
    "broker_url": "memory://",
    "result_backend": "memory://",
    "broker_heartbeat": 0,
}
"""The settings of a :func:`TestApp` (Celery's, with pyrula's in-process store)."""


class Trap:
    """Stands where the current app would: any attribute raises ``RuntimeError``."""

    def __getattr__(self, name: str) -> Any:
        if name in ("_is_coroutine", "__func__"):  # unittest.mock probes these
            return None
        raise RuntimeError("Test depends on current_app")


class UnitLogging(Logging):
    """Logging for a test app: counts as set up already, so a test never reconfigures
    the process's logging (and never marks the process's logging as set up)."""

    already_setup = True


def TestApp(
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    enable_logging: bool = False,
    set_as_current: bool = False,
    log: Any = UnitLogging,
    backend: str | None = None,
    broker: str | None = None,
    **kwargs: Any,
) -> Celery:
    """An app for tests: ``DEFAULT_TEST_CONFIG`` under ``config``; ``broker`` and
    ``backend``, when given, replace the in-process store."""
    settings = dict(deepcopy(DEFAULT_TEST_CONFIG), **(config or {}))
    if broker is not None:
        settings.pop("broker_url", None)
    if backend is not None:
        settings.pop("result_backend", None)
    app = Celery(
        name or "celery.tests",
        set_as_current=set_as_current,
        broker=broker or settings.get("broker_url"),
        backend=backend,
        log=log,
        **kwargs,
    )
    app.add_defaults(settings)
    return app


TestApp.__test__ = False  # type: ignore[attr-defined]  # not a test, for pytest


def _swap(current: Any, default: Any) -> tuple[Any, Any]:
    with _state._lock:
        before = (_state._current_app, _state._default_app)
        _state._current_app, _state._default_app = current, default
    return before


@contextmanager
def set_trap(app: Celery) -> Iterator[None]:
    """Make a :class:`Trap` the current and default app while the block runs."""
    trap = Trap()
    before = _swap(trap, trap)
    try:
        yield
    finally:
        _swap(*before)


@contextmanager
def setup_default_app(app: Celery, use_trap: bool = False) -> Iterator[None]:
    """Run the block (under :func:`set_trap` with ``use_trap``), then restore the
    current and default app; close ``app`` unless it was the current one."""
    with _state._lock:
        before = (_state._current_app, _state._default_app)
    try:
        if use_trap:
            with set_trap(app):
                yield
        else:
            yield
    finally:
        _swap(*before)
        if app is not before[0]:
            app.close()


__all__ = ["DEFAULT_TEST_CONFIG", "TestApp", "Trap", "set_trap", "setup_default_app"]
