"""The worker's log of a succeeding, a retried and a failing task reads like Celery's.

Real ``pyrula worker -A logproj`` processes on a SQLite store: Celery 5.7's lines
(``received``, ``succeeded in``, ``retry:``, ``raised unexpected`` at ERROR with the
traceback), the default formats ``worker_log_format`` / ``worker_task_log_format`` (the
task logger's records name the task and its id), ``print()`` in a task redirected to
the log at WARNING, the worker's banner still on stdout, and ``-l warning`` still
showing each failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import Workers

T = 30.0
STAMP = r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}: "


@pytest.fixture
def logproj(tmp_path: Path) -> Iterator[tuple[Any, Workers]]:
    import logproj

    url = f"sqlite:///{tmp_path / 'logs.db'}"
    previous = logproj.app.conf.broker_url
    logproj.app.conf.broker_url = url
    workers = Workers(tmp_path, url)
    try:
        yield logproj, workers
    finally:
        workers.kill_all()
        logproj.app.conf.broker_url = previous


def _stopped_log(worker: Any) -> str:
    assert worker.stop() == 0
    return str(worker.stderr)


@pytest.mark.slow
def test_a_succeeding_a_retried_and_a_failing_task_log_as_in_celery(
    logproj: tuple[Any, Workers],
) -> None:
    module, workers = logproj
    worker = workers.start("-l", "info", app="logproj")
    added = module.add.delay(2, 3)
    retried = module.flaky.delay("ok")
    failed = module.divide.delay(1, 0)
    chatty = module.chatty.delay("hi")
    assert added.get(timeout=T) == 5 and retried.get(timeout=T) == "ok"
    assert chatty.get(timeout=T) == "hi"
    with pytest.raises(ZeroDivisionError):
        failed.get(timeout=T)
    assert "pyrula worker" in worker.stdout  # the banner is not redirected
    log = _stopped_log(worker)

    assert re.search(
        rf"{STAMP}INFO/MainProcess\] Task logproj.add\[{added.id}\] received$", log, re.M
    )
    assert re.search(
        rf"INFO/MainProcess\] Task logproj.add\[{added.id}\] succeeded in \d+\.\d+(e-\d+)?s: 5$",
        log, re.M,
    )  # fmt: skip
    assert f"Task logproj.flaky[{retried.id}] retry: Retry in 0.1s: ConnectionError('down')" in log
    assert log.count(f"Task logproj.flaky[{retried.id}] received") == 2  # each attempt
    assert f"Task logproj.flaky[{retried.id}] succeeded in " in log
    failure = re.search(
        rf"{STAMP}ERROR/MainProcess\] Task logproj.divide\[{failed.id}\] raised unexpected: "
        r"ZeroDivisionError\('division by zero'\)\nTraceback \(most recent call last\):\n"
        r"(.*\n)*?ZeroDivisionError: division by zero$",
        log, re.M,
    )  # fmt: skip
    assert failure is not None, log
    assert "in divide" in failure.group(0) and "return x / y" in failure.group(0)
    assert log.count("Traceback (most recent call last)") == 1  # not again for the run
    # the task logger's format names the task; print() goes to the log at WARNING
    assert re.search(rf"INFO/MainProcess\] logproj.chatty\[{chatty.id}\]: saying hi$", log, re.M), (
        log
    )
    assert re.search(rf"{STAMP}WARNING/MainProcess\] printed hi$", log, re.M), log
    assert "printed hi" not in worker.stdout


@pytest.mark.slow
def test_at_warning_level_every_failure_still_shows_and_formats_come_from_the_settings(
    logproj: tuple[Any, Workers],
) -> None:
    module, workers = logproj
    env = {
        "LOGPROJ_FORMAT": "PROC %(levelname)s %(name)s | %(message)s",
        "LOGPROJ_TASK_FORMAT": "TASK %(task_name)s %(task_id)s | %(message)s",
    }
    worker = workers.start("-l", "warning", app="logproj", env=env)
    failed = module.divide.delay(3, 0)
    added = module.add.delay(1, 1)
    with pytest.raises(ZeroDivisionError):
        failed.get(timeout=T)
    assert added.get(timeout=T) == 2
    log = _stopped_log(worker)
    assert (
        f"PROC ERROR celery.app.trace | Task logproj.divide[{failed.id}] raised unexpected: "
        "ZeroDivisionError('division by zero')\nTraceback (most recent call last):"
    ) in log
    assert "received" not in log and "succeeded in" not in log  # INFO lines are below warning
