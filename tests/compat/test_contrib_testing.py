"""``celery.contrib.testing``: ``app`` (TestApp, the current-app trap), ``manager``
(Manager, on a worker in this process over the in-process store) and ``mocks``."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula_compat import Celery, current_app
from pyrula_compat.contrib.testing.app import (
    DEFAULT_TEST_CONFIG,
    TestApp,
    Trap,
    set_trap,
    setup_default_app,
)
from pyrula_compat.contrib.testing.manager import (
    E_STILL_WAITING,
    Manager,
    Sentinel,
    humanize_seconds,
)
from pyrula_compat.contrib.testing.mocks import ContextMock
from pyrula_compat.contrib.testing.worker import start_worker
from pyrula_compat.result import ResultSet

T = 30  # generous result timeout (seconds)


def test_a_test_app_has_celerys_test_settings_under_its_own() -> None:
    app = TestApp(config={"task_default_queue": "tests"})
    try:
        assert app.main == "celery.tests" and app.conf.task_default_queue == "tests"
        assert app.conf.timezone == "UTC" and app.conf.broker_url == "memory://"
        assert DEFAULT_TEST_CONFIG["worker_hijack_root_logger"] is False
        assert TestApp("named").main == "named"
    finally:
        app.close()


def test_the_trap_catches_code_that_uses_the_current_app() -> None:
    app = Celery("trapped", broker="memory://")
    app.set_current()
    with setup_default_app(app, use_trap=True):
        with pytest.raises(RuntimeError, match="Test depends on current_app"):
            _ = current_app.conf
        assert app.conf.timezone is None or app.conf  # the app passed in works
    assert current_app.main == "trapped"  # restored
    with set_trap(app):
        assert isinstance(current_app._get_current_object(), Trap)
    assert Trap()._is_coroutine is None  # what unittest.mock probes for


def test_setup_default_app_closes_an_app_that_was_not_current() -> None:
    keep = Celery("keep", broker="memory://")
    keep.set_current()
    other = TestApp("other")
    with setup_default_app(other):
        other.set_current()
        assert current_app.main == "other"
    assert current_app.main == "keep"


@pytest.fixture(scope="module")
def served() -> Iterator[Celery]:
    app = TestApp("managed")

    @app.task(name="managed.add")
    def add(x: int, y: int) -> int:
        return x + y

    with start_worker(app, concurrency=2):
        yield app
    app.close()


def test_manager_joins_results_and_waits(served: Celery) -> None:
    out, err = io.StringIO(), io.StringIO()
    manager = Manager(served, stdout=out, stderr=err)
    add = served.tasks["managed.add"]
    results = [add.delay(i, i) for i in range(3)]
    # join's own callback takes the values, so it returns [] as Celery's does
    assert manager.join(results[0], timeout=T) == []
    assert manager.join(ResultSet(results), timeout=T) == []
    assert [r.get(timeout=T) for r in results] == [0, 2, 4]
    assert manager.missing_results(results) == []
    assert manager.is_result_task_in_progress(results)
    manager.assert_result_tasks_in_progress_or_completed(results)

    tries: list[int] = []

    def third_time() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise Sentinel()
        return "now"

    assert (
        manager.wait_for(third_time, (Sentinel,), interval_start=0.01, emit_warning=True) == "now"
    )
    assert err.getvalue().count("Still waiting for thing") == 2
    with pytest.raises(AssertionError, match="Should not have happened: it"):
        manager.ensure_not_for_a_while(lambda: 1, (Sentinel,), desc="it", interval_start=0.01)

    def never() -> Any:
        raise Sentinel()

    manager.ensure_not_for_a_while(never, (Sentinel,), max_retries=2, interval_start=0.01)
    with pytest.raises(Sentinel):
        manager.wait_for(never, (Sentinel,), max_retries=1, interval_start=0.01)
    manager.wait_until_idle()


def test_manager_reports_missing_results_then_gives_up(served: Celery) -> None:
    out = io.StringIO()
    manager = Manager(served, stdout=out)
    nobody = served.AsyncResult("not-a-task")
    with pytest.raises(AssertionError, match="Missing task results"):
        manager.join(nobody, max_retries=2, timeout=0.05)
    assert out.getvalue().count("!Still waiting for 1/1: [not-a-task]") == 2
    assert Manager(served, no_join=True).join(nobody) is None


def test_manager_texts() -> None:
    assert humanize_seconds(0.5) == "0.50 seconds"  # microseconds on, as Celery's
    assert E_STILL_WAITING.format("x", when="in 1s", exc=KeyError()) == (
        "Still waiting for x.  Trying again in 1s: KeyError()"
    )


def test_context_mock_is_a_mock_that_works_in_with() -> None:
    mock = ContextMock()
    with mock as entered:
        assert entered is mock
    mock.__enter__.assert_called_once_with()
    assert mock.__exit__.called
    with pytest.raises(KeyError), mock:
        raise KeyError("through")  # __exit__ does not swallow it


def test_start_worker_takes_celerys_worker_options() -> None:
    """A project's ``celery_worker_parameters`` may hold Celery's worker options
    (``without_heartbeat``...): accepted and ignored, beside pyrula's own."""
    from pyrula_compat.contrib.testing.worker import start_worker

    app = Celery("options", broker="memory://", set_as_current=False)

    @app.task(name="options.add")
    def add(x: int, y: int) -> int:
        return x + y

    with start_worker(
        app, without_heartbeat=False, without_mingle=True, queues=["celery"],
        claim_poll_interval=0.02, perform_ping_check=False,
    ) as worker:  # fmt: skip
        assert worker.options.claim_poll_interval == 0.02
        assert add.delay(2, 3).get(timeout=20) == 5
