"""``result_expires``: a task's run (and its result) is deleted that long after it ended,
after which its id reads ``PENDING`` again, as in Celery; ``pyrula worker
--run-retention`` says the same on the command line and wins over the setting."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pyrula_compat import Celery, states
from pyrula_compat.exceptions import ImproperlyConfigured
from pyrula_compat.result import AsyncResult
from pyrula_compat.worker import AppWorker
from tests.compat.conftest import Served, wait_until

T = 30


@pytest.mark.slow
def test_results_expire_then_read_pending(served: Served) -> None:
    import proj.tasks as t

    kept = t.add.delay(1, 1)
    assert kept.get(timeout=T) == 2  # before any worker with a short retention runs
    served.workers.start(env={"PROJ_RESULT_EXPIRES": "1.5"})
    result = t.add.delay(2, 3)
    assert result.get(timeout=T) == 5
    assert result.state == states.SUCCESS and result.date_done is not None

    def expired() -> bool:
        return AsyncResult(result.id).state == states.PENDING

    wait_until(expired, timeout=T, what="the result to expire")
    gone = AsyncResult(result.id)
    assert gone.result is None and not gone.ready() and gone.date_done is None
    assert AsyncResult(kept.id).state == states.PENDING  # the retention is store-wide
    # The id may be used again: a new run, not the forgotten one.
    again = t.add.apply_async((4, 4), task_id=result.id)
    assert again.get(timeout=T) == 8


def make_app(**conf: Any) -> Celery:
    app = Celery("expiring", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return app


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (0, None),
        (timedelta(days=2), 172800.0),
        (3600, 3600.0),
        (2.5, 2.5),
        ("60", 60.0),
    ],
)
def test_result_expires_becomes_the_run_retention(value: Any, seconds: float | None) -> None:
    assert AppWorker(make_app(result_expires=value)).retention() == seconds


def test_the_default_keeps_results_a_day() -> None:
    assert AppWorker(make_app()).retention() == 86400.0


@pytest.mark.parametrize("value", ["soon", -5, timedelta(seconds=-1), [1]])
def test_a_bad_result_expires_is_refused(value: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="result_expires"):
        AppWorker(make_app(result_expires=value)).retention()


expiring_app = make_app(result_expires=30)


@pytest.mark.parametrize(("flag", "retention"), [(None, 30.0), (5.0, 5.0)])
def test_the_command_line_wins_over_the_setting(flag: float | None, retention: float) -> None:
    from pyrula.cli import app_loader

    values: dict[str, Any] = {
        "celery_app": "tests.compat.test_result_expires.expiring_app",
        "run_retention": flag,
    }
    app_loader.load(values, "WARNING")
    assert values["run_retention"] == retention
