"""``pyrula dev`` as a real process: its worker runs what the test submits, and its
dashboard shows the runs, their journals, workers and schedules as HTML and JSON.

One ``pyrula dev`` process serves the module's read tests (started once, killed by PID
at teardown); the stop and start-up tests start their own. The test process submits
runs through the blocking client on the same SQLite file and reads pages with urllib.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import RunStatus, Schedule, SqliteStore
from pyrula.workflows.sync import WorkflowClient
from tests.integration.test_cli_worker import (
    REPO_ROOT,
    START_TIMEOUT,
    STOP_TIMEOUT,
    Worker,
    ask,
    pyrula_command,
    wait_until,
)

pytestmark = pytest.mark.slow

APP = """
from pyrula.workflows import RetryPolicy, StepContext, WorkflowContext, step, workflow


def add(a, b):
    return a + b


def boom(message):
    raise ValueError(message)


@step(name="report")
def report(sctx: StepContext, done: int) -> int:
    sctx.set_progress("HALFWAY", {"done": done})
    return done


@workflow(name="devt_add")
async def devt_add(ctx: WorkflowContext, a: int, b: int, note: str = "") -> dict:
    total = await ctx.step("add", add, a, b)
    await report(total)
    return {"sum": total}


@workflow(name="devt_fail")
async def devt_fail(ctx: WorkflowContext, message: str) -> None:
    await ctx.step("prepare", add, 1, 1)
    await ctx.step("explode", boom, message, retry=RetryPolicy(max_attempts=1))
"""
LISTENING = re.compile(r"^pyrula dev: dashboard on (http://127\.0\.0\.1:(\d+)/)")
WAIT_S = 30.0


@dataclass
class Site:
    """The dashboard at ``base``."""

    base: str

    def get(self, path: str) -> tuple[int, str, str]:
        """Status, content type and body of GET ``path``; 4xx/5xx are returned too."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.base + path.lstrip("/"), timeout=10) as reply:
                return reply.status, reply.headers["Content-Type"], reply.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers["Content-Type"], exc.read().decode()

    def json(self, path: str) -> Any:
        status, kind, body = self.get(path)
        assert status == 200, body
        assert kind.startswith("application/json")
        return json.loads(body)


@dataclass
class Dev(Site):
    """A ``pyrula dev`` process, its dashboard, and a client on its store."""

    worker: Worker
    client: WorkflowClient

    def run(self, workflow: str, params: dict[str, Any]) -> str:
        """Submit a run and wait until the dev process's worker has ended it."""
        run_id = self.client.submit(workflow, params).run_id
        record = self.client.wait_run(run_id, WAIT_S)
        assert record.is_terminal, f"{workflow} run still {record.status.value}"
        return run_id


def start_dev(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> Worker:
    """``pyrula dev app.py`` on a free port (``--port 0``) with a SQLite store in ``tmp``."""
    (tmp / "app.py").write_text(APP)
    out, err = tmp / "dev.out", tmp / "dev.err"
    environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
    environ.pop("PYRULA_STORE_URL", None)
    store = f"sqlite:///{tmp / 'pyrula.db'}"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*pyrula_command(), "dev", "app.py", "--store", store, "--port", "0", *flags],
            cwd=tmp,
            env=environ,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    return Worker(proc, out, err)


def wait_ready(worker: Worker) -> str:
    """The dashboard's URL, once the worker's banner follows the listening line."""
    wait_until(lambda: "pyrula worker" in worker.stdout, START_TIMEOUT, "the banner", worker)
    match = LISTENING.match(worker.stdout)
    assert match, f"first line is not the dashboard address:\n{worker.stdout}"
    return match.group(1)


def kill(worker: Worker) -> None:
    if worker.proc.poll() is None:
        worker.proc.kill()
        worker.proc.wait(10)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    tmp = tmp_path_factory.mktemp("dev")
    worker = start_dev(tmp)
    try:
        base = wait_ready(worker)
        with WorkflowClient(SqliteStore(tmp / "pyrula.db"), require_registered=False) as client:
            yield Dev(base, worker, client)
    finally:
        kill(worker)


def test_the_runs_page_lists_runs_with_their_status(dev: Dev) -> None:
    done = dev.run("devt_add", {"a": 1, "b": 2})
    failed = dev.run("devt_fail", {"message": "no luck"})
    status, kind, body = dev.get("/")
    assert status == 200 and kind.startswith("text/html")
    for run_id, state in ((done, "completed"), (failed, "failed")):
        row = re.search(rf'<tr><td><a href="/runs/{run_id}">.*?</tr>', body)
        assert row, body
        assert f">{state}</span>" in row.group(0) and "devt_" in row.group(0)


def test_the_runs_page_filters_by_status_and_workflow(dev: Dev) -> None:
    done = dev.run("devt_add", {"a": 2, "b": 2})
    failed = dev.run("devt_fail", {"message": "filtered"})
    _, _, by_status = dev.get("/?status=failed")
    assert failed in by_status and done not in by_status
    _, _, by_workflow = dev.get("/?workflow=devt_add&status=")
    assert done in by_workflow and failed not in by_workflow
    assert dev.get("/?status=nonsense")[0] == 400


def test_the_run_page_shows_result_progress_and_journal_steps(dev: Dev) -> None:
    run_id = dev.run("devt_add", {"a": 20, "b": 22})
    status, _, body = dev.get(f"/runs/{run_id}")
    assert status == 200
    assert "&quot;sum&quot;: 42" in body  # the result, pretty-printed and escaped
    assert "HALFWAY" in body and "&quot;done&quot;: 42" in body
    steps = re.findall(r"<tr><td>(\d+)</td><td>step</td><td>([^<]+)</td>", body)
    assert steps == [("0", "add"), ("1", "report")]


def test_a_failed_run_shows_its_error_and_traceback(dev: Dev) -> None:
    run_id = dev.run("devt_fail", {"message": "disk on fire"})
    _, _, body = dev.get(f"/runs/{run_id}")
    assert "<b>builtins.ValueError</b>: disk on fire" in body
    assert "Traceback (most recent call last)" in body and "in boom" in body
    assert re.search(r"<td>explode</td><td><span class=\"s-failed\">failed</span>", body)


def test_params_are_html_escaped(dev: Dev) -> None:
    evil = "<script>alert(1)</script>"
    run_id = dev.run("devt_add", {"a": 0, "b": 0, "note": evil})
    _, _, page = dev.get(f"/runs/{run_id}")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert evil not in page
    scripts = re.findall(r"<script[^>]*>", page)
    assert scripts == ['<script src="/static/app.js" defer>']  # the dashboard's own, only
    assert dev.json(f"/api/runs/{run_id}")["run"]["params"]["note"] == evil


def test_the_json_endpoints(dev: Dev) -> None:
    run_id = dev.run("devt_add", {"a": 5, "b": 5})
    ask(
        dev.client,
        lambda s: s.create_schedule(
            Schedule.create(
                "devt_add", params={"a": 1, "b": 1}, every=3600, schedule_id="h"
            ).to_record(time.time())
        ),
    )
    runs = dev.json("/api/runs?workflow=devt_add&limit=500")["runs"]
    assert run_id in [r["run_id"] for r in runs]
    assert {r["workflow"] for r in runs} == {"devt_add"}
    completed = dev.json("/api/runs?status=completed")["runs"]
    assert completed and {r["status"] for r in completed} == {RunStatus.COMPLETED.value}
    one = dev.json(f"/api/runs/{run_id}")
    assert one["run"]["result"] == {"sum": 10}
    assert [(e["position"], e["name"], e["ok"]) for e in one["journal"]] == [
        (0, "add", True),
        (1, "report", True),
    ]
    workers = dev.json("/api/workers")["workers"]
    assert [w["alive"] for w in workers if w["pid"] == dev.worker.proc.pid] == [True]
    schedules = dev.json("/api/schedules")["schedules"]
    assert [(s["schedule_id"], s["every_s"]) for s in schedules] == [("h", 3600)]
    for path, shown in (
        ("/workers", f"<td>{dev.worker.proc.pid}</td>"),
        ("/schedules", "every 3600s"),
    ):
        status, kind, body = dev.get(path)
        assert status == 200 and kind.startswith("text/html") and shown in body


def test_unknown_runs_and_pages_are_404(dev: Dev) -> None:
    status, kind, body = dev.get("/runs/no-such-run")
    assert status == 404 and kind.startswith("text/html") and "no-such-run" in body
    status, kind, body = dev.get("/api/runs/no-such-run")
    assert status == 404 and json.loads(body)["status"] == 404
    assert dev.get("/nowhere")[0] == 404


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_worker_and_dashboard_with_exit_0(tmp_path: Path, signum: int) -> None:
    opened = tmp_path / "opened.txt"
    browser = f"{sys.executable} -c \"import sys; open('{opened}', 'w').write(sys.argv[1])\""
    worker = start_dev(tmp_path, "--open", env={"BROWSER": browser + " %s"})
    try:
        base = wait_ready(worker)
        wait_until(opened.exists, WAIT_S, "the browser to be opened", worker)
        assert opened.read_text() == base
        worker.proc.send_signal(signum)
        try:
            code = worker.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pyrula dev did not exit after {signum!r}:\n{worker.stderr}")
        assert code == 0, worker.stderr
        assert "Traceback" not in worker.stderr and "stopped" in worker.stderr
        with pytest.raises(urllib.error.URLError):
            urllib.request.build_opener(urllib.request.ProxyHandler({})).open(base, timeout=5)
    finally:
        kill(worker)


def test_an_app_file_that_does_not_exist_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*pyrula_command(), "dev", "missing.py", "--port", "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no such file: missing.py" in proc.stderr


CELERY_APP = """
import os
from pyrula_compat import Celery

app = Celery("devt_celery", broker=os.environ["DEVT_BROKER"])


@app.task
def add(x, y):
    return x + y
"""


def test_a_celery_app_file_is_served_on_its_broker_store(tmp_path: Path) -> None:
    (tmp_path / "devt_celery.py").write_text(CELERY_APP)
    broker = f"sqlite:///{tmp_path / 'broker.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "DEVT_BROKER": broker}
    env.pop("PYRULA_STORE_URL", None)
    out, err = tmp_path / "dev.out", tmp_path / "dev.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*pyrula_command(), "dev", "devt_celery.py", "--port", "0"],
            cwd=tmp_path, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    worker = Worker(proc, out, err)
    try:
        site = Site(wait_ready(worker))
        assert "devt_celery.add" in worker.stdout and broker in worker.stdout
        caller = "import devt_celery; print(devt_celery.add.delay(2, 3).get(timeout=30))"
        result = subprocess.run(
            [sys.executable, "-c", caller],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.stdout.strip() == "5", result.stderr
        runs = site.json("/api/runs?workflow=devt_celery.add")["runs"]
        assert [r["status"] for r in runs] == ["completed"]
        assert worker.stop() == 0, worker.stderr
    finally:
        kill(worker)
