"""``pyrula worker -A`` forms and flags, ``pyrula init``, and a Django project."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrula_compat import Celery
from tests.compat.conftest import HERE, REPO_ROOT, Workers, pyrula_command

pytestmark = pytest.mark.slow
T = 30


def run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    environment.pop("PYRULA_STORE_URL", None)
    environment.update(env or {})
    return subprocess.run(
        args, cwd=cwd, env=environment, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("celery", [True, False])
def test_init_writes_a_project_whose_app_py_exits_0(tmp_path: Path, celery: bool) -> None:
    target = tmp_path / "project"
    flags = ["--celery"] if celery else []
    made = run([*pyrula_command(), "init", *flags, str(target)], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert (target / "app.py").exists()
    if celery:
        assert (target / "proj" / "celery.py").exists() and (target / "proj" / "tasks.py").exists()
        assert "import celery" not in (target / "proj" / "tasks.py").read_text()
    env = {"PYTHONPATH": ""}
    ran = run([sys.executable, "app.py"], cwd=target, env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "welcome:" in ran.stdout
    again = run([*pyrula_command(), "init", *flags, str(target)], cwd=tmp_path)
    assert again.returncode == 1 and "not overwriting" in again.stderr


def test_app_forms_and_celery_only_flags(tmp_path: Path) -> None:
    workers = Workers(tmp_path, f"sqlite:///{tmp_path / 'forms.db'}")
    try:
        first = workers.start("-Q", "default,emails", "-B", "--pool", "prefork", "-O", "fair",
                              app="proj.celery.app")  # fmt: skip
        assert "proj.tasks.add" in first.stdout
        for note in ("-Q accepted", "-B accepted", "-O accepted"):
            assert note in first.stderr
        assert "-P accepted" not in first.stderr  # --pool prefork works: no note
        second = workers.start(app="proj.celery:app")
        third = workers.start(app="proj.celery")
        for worker in (first, second, third):
            assert worker.stop() == 0
    finally:
        workers.kill_all()


def test_start_up_errors_are_clear(tmp_path: Path) -> None:
    amqp = run([*pyrula_command(), "worker", "-A", "proj"], cwd=HERE,
               env={"CELERY_BROKER_URL": "amqp://guest@localhost//"})  # fmt: skip
    assert amqp.returncode == 2 and "needs no separate message broker" in amqp.stderr
    pickle = run([*pyrula_command(), "worker", "-A", "badproj"], cwd=HERE)
    assert pickle.returncode == 2 and "JSON only" in pickle.stderr
    missing = run([*pyrula_command(), "worker"], cwd=HERE)
    assert missing.returncode == 2 and "-A APP" in missing.stderr


def test_django_project_worker_sets_django_up_and_finds_urlconf_tasks(tmp_path: Path) -> None:
    pytest.importorskip("django")
    broker = f"sqlite:///{tmp_path / 'dj.db'}"
    env = {"DJPROJ_BROKER": broker, "DJPROJ_DB": str(tmp_path / "django.sqlite3")}
    workers = Workers(tmp_path, broker)
    try:
        worker = workers.start(app="djproj", env=env)
        assert "shop.tasks.shop_total" in worker.stdout  # autodiscovered
        assert "shop.views.from_urlconf" in worker.stdout  # imported by the system checks
        assert "beat_scheduler" in worker.stderr  # tolerated, with a warning
        caller = Celery("caller", broker=broker, set_as_current=False)
        assert caller.send_task("shop.tasks.shop_total", (2, 3)).get(timeout=T) == 5
        result = caller.send_task("shop.views.from_urlconf", ("hi",))
        assert result.get(timeout=T) == "view module says hi"
        code = (
            "import django, os\n"
            "django.setup()\n"
            "from django.db import transaction\n"
            "from pyrula_compat.result import AsyncResult\n"
            "from shop.tasks import shop_total\n"
            "import djproj\n"
            "with transaction.atomic():\n"
            "    assert shop_total.apply_async_on_commit((4, 5), task_id='after-commit') is None\n"
            "    assert not AsyncResult('after-commit').exists()\n"
            "print(AsyncResult('after-commit').get(timeout=30))\n"
        )
        done = run([sys.executable, "-c", code], cwd=HERE,
                   env={**env, "DJANGO_SETTINGS_MODULE": "djproj.settings"})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "9"
    finally:
        workers.kill_all()
