"""``celery.contrib.pytest``: the pytest fixtures Celery ships, on pyrula.

Enable them as with Celery, in a ``conftest.py``::

    pytest_plugins = ("pyrula_compat.contrib.pytest",)

``celery_app`` is a fresh app on an in-process store (``memory://``) configured by
``celery_config`` (and a test's ``@pytest.mark.celery(**overrides)``); ``celery_worker``
serves it on a thread of this process (``start_worker``) for the test. The session
variants (``celery_session_app``, ``celery_session_worker``) live for the whole run.
Override ``celery_config``, ``celery_parameters``, ``celery_includes``,
``celery_worker_parameters`` or ``celery_class_tasks`` as in Celery.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from pyrula_compat import _state
from pyrula_compat.app.base import Celery
from pyrula_compat.contrib.testing.worker import start_worker

NO_WORKER = os.environ.get("NO_WORKER")
"""Set (as in Celery) to make ``celery_session_worker`` start no worker."""

TEST_CONFIG: dict[str, Any] = {"broker_url": "memory://", "result_backend": "memory://"}
"""What a test app starts from, before ``celery_config`` (an in-process store)."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "celery(**overrides): override celery configuration for a test case"
    )


@contextmanager
def _test_app(parameters: Mapping[str, Any], config: Mapping[str, Any]) -> Iterator[Celery]:
    """A test app, current and default while the block runs (as Celery's TestApp)."""
    settings = {**TEST_CONFIG, **config}
    app = Celery(
        "celery.tests", broker=settings.get("broker_url"), set_as_current=False, **parameters
    )
    app.conf.update(settings)
    current, default = _state._current_app, _state._default_app
    app.set_default()
    try:
        yield app
    finally:
        app.close()
        with _state._lock:
            _state._current_app, _state._default_app = current, default


def _overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker("celery")
    return dict(marker.kwargs) if marker is not None else {}


@contextmanager
def _worker_for(
    app: Celery, includes: Sequence[str], parameters: Mapping[str, Any], tasks: Sequence[Any]
) -> Iterator[Any]:
    for module in includes:
        importlib.import_module(module)
    for task in tasks:
        app.register_task(task)
    with start_worker(app, **parameters) as worker:
        yield worker


@pytest.fixture(scope="session")
def use_celery_app_trap() -> bool:
    """Accepted for Celery's signature; pyrula has no app trap."""
    return False


@pytest.fixture(scope="session")
def celery_enable_logging() -> bool:
    return False


@pytest.fixture(scope="session")
def celery_includes() -> Sequence[str]:
    """Modules the worker fixtures import before they start (task modules, signals)."""
    return ()


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    """Accepted for Celery's signature: a pyrula worker runs sync tasks on threads."""
    return "solo"


@pytest.fixture(scope="session")
def celery_config() -> Mapping[str, Any]:
    """Redefine to configure the test app."""
    return {}


@pytest.fixture(scope="session")
def celery_parameters() -> Mapping[str, Any]:
    """Redefine to pass arguments to the test app's ``Celery(...)``."""
    return {}


@pytest.fixture(scope="session")
def celery_worker_parameters() -> Mapping[str, Any]:
    """Redefine to pass arguments to ``start_worker`` (``WorkerOptions`` fields too)."""
    return {}


@pytest.fixture
def celery_class_tasks() -> Sequence[Any]:
    """Redefine to register class-based tasks with the test app."""
    return []


@pytest.fixture(scope="session")
def celery_session_app(
    request: pytest.FixtureRequest,
    celery_config: Mapping[str, Any],
    celery_parameters: Mapping[str, Any],
    celery_enable_logging: bool,
    use_celery_app_trap: bool,
) -> Iterator[Celery]:
    with _test_app(celery_parameters, celery_config) as app:
        yield app


@pytest.fixture(scope="session")
def celery_session_worker(
    request: pytest.FixtureRequest,
    celery_session_app: Celery,
    celery_includes: Sequence[str],
    celery_worker_pool: str,
    celery_worker_parameters: Mapping[str, Any],
) -> Iterator[Any]:
    if NO_WORKER:  # the tests reach workers started elsewhere
        yield None
        return
    with _worker_for(celery_session_app, celery_includes, celery_worker_parameters, []) as w:
        yield w


@pytest.fixture
def celery_app(
    request: pytest.FixtureRequest,
    celery_config: Mapping[str, Any],
    celery_parameters: Mapping[str, Any],
    celery_enable_logging: bool,
    use_celery_app_trap: bool,
) -> Iterator[Celery]:
    with _test_app(celery_parameters, {**celery_config, **_overrides(request)}) as app:
        yield app


@pytest.fixture
def celery_worker(
    request: pytest.FixtureRequest,
    celery_app: Celery,
    celery_includes: Sequence[str],
    celery_worker_pool: str,
    celery_worker_parameters: Mapping[str, Any],
    celery_class_tasks: Sequence[Any],
) -> Iterator[Any]:
    with _worker_for(
        celery_app, celery_includes, celery_worker_parameters, celery_class_tasks
    ) as w:
        yield w


@pytest.fixture
def depends_on_current_app(celery_app: Celery) -> None:
    """Make ``celery_app`` the current app for the test."""
    celery_app.set_current()
