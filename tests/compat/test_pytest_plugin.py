"""``pyrula_compat.contrib.pytest`` (Celery's ``celery.contrib.pytest`` fixtures), used the
way a project's test suite uses them: a ``conftest.py`` with ``pytest_plugins``, run by
pytest in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = """
import pytest

pytest_plugins = ("pyrula_compat.contrib.pytest",)


@pytest.fixture(scope="session")
def celery_config():
    return {"task_default_retry_delay": 0}


@pytest.fixture(scope="session")
def celery_includes():
    return ["plug_tasks"]
"""

TASKS = """
from pyrula_compat import shared_task


@shared_task
def mul(x, y):
    return x * y
"""

TESTS = """
import pytest

from pyrula_compat import current_app
from plug_tasks import mul


def test_a_task_defined_in_the_test_after_reload(celery_app, celery_worker):
    @celery_app.task
    def add(x, y):
        return x + y

    celery_worker.reload()
    assert add.delay(2, 3).get(timeout=10) == 5
    assert mul.delay(2, 3).get(timeout=10) == 6  # a shared task of an included module
    assert current_app.main == "celery.tests"
    assert celery_app.conf.task_default_retry_delay == 0


@pytest.mark.celery(result_expires=7)
def test_the_marker_overrides_the_config(celery_app):
    assert celery_app.conf.result_expires == 7
    assert celery_app.conf.task_default_retry_delay == 0


def test_the_session_worker(celery_session_app, celery_session_worker):
    assert mul.delay(3, 4).get(timeout=10) == 12


def test_the_app_is_current_only_while_it_lives(celery_app, depends_on_current_app):
    assert current_app.main == "celery.tests"
"""


@pytest.mark.slow
def test_celerys_pytest_fixtures(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "plug_tasks.py").write_text(TASKS)
    (tmp_path / "test_with_fixtures.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout
