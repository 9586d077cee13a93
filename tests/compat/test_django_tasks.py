"""Django's task framework on pyrula: the ``djtasks`` project (``tests/compat/djtasks``)
enqueues through ``TASKS = {"default": {"BACKEND": "pyrula_compat.django.PyrulaTaskBackend",
...}}`` and ``python manage.py pyrula_worker`` serves its tasks, as real processes, on a
SQLite store and on a real valkey-server: enqueue, get_result, refresh, run_after, async
tasks and the async API, takes_context, a failure with its errors, and what the backend
refuses. With Django 6 (``django.tasks``, Python 3.12 or newer) where an interpreter for it
is found; on Django 5.2 through the ``django_tasks`` backport, in the project's venv.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import REPO_ROOT, wait_until

pytestmark = pytest.mark.slow

PROJECT = REPO_ROOT / "tests" / "compat" / "djtasks"
DJANGO6 = "django==6.1.3"


def django6_python(cache: Path) -> str | None:
    """An interpreter with Django 6 and pyrula's runtime dependencies (a venv made once
    under ``cache``), or None when no Python 3.12+ is on this machine."""
    pyenv = sorted((Path.home() / ".pyenv" / "versions").glob("3.1[2-9]*/bin/python3"))
    choices = [os.environ.get("PYRULA_TEST_PYTHON312"), *map(str, pyenv)]
    choices += [shutil.which(f"python3.{minor}") for minor in range(12, 16)]
    found = next((c for c in choices if c and _runs(c)), None)
    if found is None:
        return None
    venv = cache / "django6-venv"
    python = venv / "bin" / "python"
    if not (venv / "ok").exists():
        subprocess.run([found, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", DJANGO6, "valkey>=6.2,<6.3",
             "croniter>=2.0", "click>=8.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        (venv / "ok").write_text("")
    return str(python)


def _runs(python: str) -> bool:
    done = subprocess.run([python, "-c", "import sys; assert sys.version_info >= (3, 12)"],
                          capture_output=True, check=False)  # fmt: skip
    return done.returncode == 0


class Project:
    """The djtasks project on one store: its worker process and its scenario runs."""

    def __init__(self, python: str, tmp: Path, store: str) -> None:
        self.python = python
        self.tmp = tmp
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "PYRULA_STORE_URL"},
            "PYTHONPATH": str(REPO_ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.compat.djtasks.settings",
            "DJTASKS_DB": str(tmp / "django.sqlite3"),
            "DJTASKS_STORE": store,
        }
        self.worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        with (self.tmp / "worker.out").open("wb") as out:
            self.worker = subprocess.Popen(
                [self.python, str(PROJECT / "manage.py"), "pyrula_worker",
                 "--claim-poll-interval", "0.05", "--timer-poll-interval", "0.2"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        wait_until(lambda: "serving" in self.output() or self.worker.poll() is not None, 60,
                   "the worker")  # fmt: skip
        assert self.worker.poll() is None, self.output()

    def output(self) -> str:
        path = self.tmp / "worker.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def scenario(self, name: str) -> dict[str, Any]:
        done = subprocess.run(
            [self.python, str(PROJECT / "scenario.py"), name], env=self.env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + self.output()
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            os.kill(self.worker.pid, signal.SIGTERM)
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.worker.pid, signal.SIGKILL)
                self.worker.wait(10)


@pytest.fixture(params=["django5-backport", "django6"])
def python(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "django5-backport":
        return sys.executable
    cache = Path.home() / ".cache" / "pyrula-tests"
    cache.mkdir(parents=True, exist_ok=True)
    found = django6_python(cache)
    if found is None:
        pytest.skip("no Python 3.12+ for Django 6 on this machine")
    return found


@pytest.fixture(params=["sqlite", "valkey"])
def project(request: pytest.FixtureRequest, python: str, tmp_path: Path) -> Iterator[Project]:
    if request.param == "sqlite":
        store = f"sqlite:///{tmp_path / 'pyrula.db'}"
    else:
        server = request.getfixturevalue("valkey_server")
        store = f"{server.url}/0?namespace=dj{uuid.uuid4().hex[:10]}"
    proj = Project(python, tmp_path, store)
    try:
        proj.start_worker()
        yield proj
    finally:
        proj.stop()


def test_tasks_run_durably_and_report_as_django_says(project: Project) -> None:
    seen = project.scenario("basics")
    assert seen["first_status"] == "READY" and seen["status"] == "SUCCESSFUL"
    assert seen["value"] == 5 and seen["args"] == [2, 3] and seen["attempts"] == 1
    assert seen["enqueued"] and seen["finished"]
    assert seen["email"] == "a@example.com" and seen["email_queue"] == "emails"
    assert seen["failed_status"] == "FAILED" and seen["failed_is_error"]
    assert seen["error_class"] == "builtins.ValueError"
    assert "ValueError: cannot: no stock" in seen["error_tb"]
    assert seen["context_attempt"] == 1
    assert seen["async"] == "awake"
    assert seen["rows"] == 1  # the worker reads the project's database


def test_run_after_and_the_async_api(project: Project) -> None:
    later = project.scenario("defer")
    assert later["started_after"] and later["late_by"] >= 0
    assert project.scenario("async_api") == {"value": 42}


def test_what_the_backend_refuses(project: Project) -> None:
    refused = project.scenario("refused")
    assert refused["priority"] == "Backend does not support setting priority of tasks."
    assert refused["queue"] == "Queue 'nope' is not valid for backend."
