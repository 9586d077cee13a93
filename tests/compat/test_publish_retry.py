"""Publishing while the store blips, as Celery does: a send that meets an unreachable
store is retried as ``task_publish_retry_policy`` says (max_retries, interval_start,
interval_step, interval_max), then raises ``OperationalError``, kombu's when kombu is
installed. Against a real valkey-server the test stops and starts again by its PID."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows.errors import StoreUnavailable
from pyrula_compat import Celery
from pyrula_compat.exceptions import OperationalError
from pyrula_compat.publish_retry import intervals
from tests.compat.conftest import REPO_ROOT
from tests.valkey.servers import ValkeyProcess, free_port, fresh_namespace

CELERY57 = Path("/work/ref/celery57")
QUICK = {"max_retries": 2, "interval_start": 0.01, "interval_step": 0.01, "interval_max": 0.05}


@pytest.fixture
def server() -> Iterator[ValkeyProcess]:
    process = ValkeyProcess(persist=True)  # a restart keeps the data, as a blip does
    process.start()
    try:
        yield process
    finally:
        process.cleanup()  # stopped by its PID


@pytest.fixture
def app(server: ValkeyProcess) -> Iterator[Celery]:
    app = Celery(
        "blip", broker=f"{server.url}/0?namespace={fresh_namespace()}", set_as_current=False
    )

    @app.task(name="blip.add")
    def add(x: int, y: int) -> int:
        return x + y

    yield app
    app.close()


def test_intervals_follow_kombus_retry_over_time() -> None:
    policy = {"interval_start": 0, "interval_step": 0.2, "interval_max": 0.5}
    sleeps = intervals(policy)
    assert [round(next(sleeps), 6) for _ in range(5)] == [0.0, 0.2, 0.4, 0.5, 0.5]


def test_a_send_during_a_restart_is_retried_and_lands(app: Celery, server: ValkeyProcess) -> None:
    add = app.tasks["blip.add"]
    assert app.client().get_run(add.delay(1, 1).id) is not None
    app.conf.task_publish_retry_policy = {
        "max_retries": 200, "interval_start": 0.02, "interval_step": 0.02, "interval_max": 0.1,
    }  # fmt: skip
    server.stop()
    restart = threading.Timer(0.3, server.start)
    restart.start()
    try:
        result = add.delay(2, 3)  # refused at first: retried until the server is back
    finally:
        restart.join()
    record = app.client().get_run(result.id)
    assert record is not None and record.workflow == "blip.add"
    sent = app.send_task("blip.add", (1, 2))
    assert app.client().get_run(sent.id) is not None


def test_a_store_that_stays_down_raises_operational_error(
    app: Celery, server: ValkeyProcess
) -> None:
    add = app.tasks["blip.add"]
    app.conf.task_publish_retry_policy = QUICK
    app.client()  # opened while the server is up
    server.stop()
    with pytest.raises(OperationalError) as raised:
        add.delay(1, 2)
    message = str(raised.value)
    assert message.startswith("task blip.add[") and "not sent after 3 tries" in message
    assert "max_retries': 2" in message and f"127.0.0.1:{server.port}" in message
    assert isinstance(raised.value.__cause__, StoreUnavailable)
    failed_id = message.split("[", 1)[1].split("]", 1)[0]

    with pytest.raises(OperationalError, match=r"after 2 tries"):
        add.apply_async((1, 2), retry_policy={"max_retries": 1})  # merged over the setting
    with pytest.raises(OperationalError, match=r"after 1 try \(task_publish_retry is off\)"):
        add.apply_async((1, 2), retry=False)
    app.conf.task_publish_retry = False
    with pytest.raises(OperationalError, match=r"after 1 try \(task_publish_retry is off\)"):
        app.send_task("blip.add", (1, 2))
    server.start()
    assert app.client().get_run(failed_id) is None  # nothing was stored for it


def test_a_bad_policy_value_is_refused_naming_it(app: Celery) -> None:
    app.conf.task_publish_retry_policy = {"max_retries": "three"}
    with pytest.raises(TypeError, match=r"task_publish_retry_policy\['max_retries'\] takes"):
        app.tasks["blip.add"].delay(1, 2)


KOMBU_SCRIPT = textwrap.dedent(
    """
    import sys
    import celery.exceptions
    import kombu.exceptions
    from pyrula_compat import Celery
    from pyrula_compat.exceptions import OperationalError

    assert issubclass(OperationalError, kombu.exceptions.OperationalError)
    assert celery.exceptions.OperationalError is kombu.exceptions.OperationalError
    app = Celery("down", broker=sys.argv[1], set_as_current=False)
    app.conf.task_publish_retry_policy = {"max_retries": 1, "interval_start": 0.01}
    try:
        app.send_task("down.add", (1, 2))
    except kombu.exceptions.OperationalError as exc:  # what Celery code catches
        print("caught", type(exc).__module__, exc)
    """
)


def test_kombus_operational_error_catches_it_when_kombu_is_installed(tmp_path: Path) -> None:
    if not (CELERY57 / "kombu").is_dir():
        pytest.skip("Celery 5.7 and kombu are not installed at /work/ref/celery57")
    script = tmp_path / "kombu_catch.py"
    script.write_text(KOMBU_SCRIPT)
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env: dict[str, Any] = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(CELERY57), str(REPO_ROOT)]),
    }
    env.pop("CELERY_BROKER_URL", None)
    done = subprocess.run(
        [sys.executable, str(script), down], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("caught pyrula_compat.exceptions task down.add[")
    assert "not sent after 2 tries" in done.stdout
