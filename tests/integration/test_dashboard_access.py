"""Who may reach ``pyrula dashboard`` and ``pyrula flower``: Basic authentication (wrong
credentials get 401 and no data), the refusal to serve a non-loopback address without
it, the URL prefix, and ``flower -A`` on a Celery app's store. Real processes on SQLite."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.cli.dashboard.command import check_exposure, is_loopback
from pyrula.cli.dashboard.http import BasicAuth
from pyrula.cli.render import CliUsageError
from pyrula.workflows import SqliteStore
from pyrula.workflows.sync import WorkflowClient
from tests.integration.cli_checks import assert_one_error_line, invoke
from tests.integration.dashboard_processes import Dashboard, Processes
from tests.integration.test_cli_worker import REPO_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.stop_all()


def test_wrong_or_missing_credentials_get_401_and_no_data(
    processes: Processes, tmp_path: Path
) -> None:
    db = tmp_path / "pyrula.db"
    with WorkflowClient(SqliteStore(db), require_registered=False) as client:
        run_id = client.submit("dash_add", {"a": 1, "b": 2, "note": "private-note"}).run_id
    site = processes.dashboard(f"sqlite:///{db}", "--basic-auth", "ops:s3cret,viewer:other")
    for path in ("/", f"/runs/{run_id}", "/api/runs", f"/api/runs/{run_id}", "/static/app.js",
                 f"/api/live?path=/runs/{run_id}"):  # fmt: skip
        for credentials in (None, ("ops", "wrong"), ("nobody", "s3cret"), ("ops", "")):
            reply = site.get(path, credentials=credentials)
            assert reply.status == 401, (path, credentials)
            assert run_id not in reply.body and "private-note" not in reply.body
    refused = site.post(f"/api/runs/{run_id}/cancel", credentials=("ops", "nope"))
    assert refused.status == 401
    assert (
        site.get(f"/api/runs/{run_id}", credentials=("ops", "s3cret")).json()["run"]["status"]
        == "queued"
    )
    ok = site.get(f"/runs/{run_id}", credentials=("viewer", "other"))
    assert ok.status == 200 and "private-note" in ok.body
    cancelled = site.post(f"/api/runs/{run_id}/cancel", credentials=("ops", "s3cret"))
    assert cancelled.status == 200 and cancelled.json()["run"]["status"] == "cancelled"
    history = site.get(f"/api/runs/{run_id}", credentials=("ops", "s3cret")).json()["actions"]
    assert [(a["action"], a["by"]) for a in history] == [("cancel", "ops")]
    assert site.process.stop() == 0, site.process.stderr  # SIGTERM: a clean stop
    assert "Traceback" not in site.process.stderr


def test_a_non_loopback_address_without_auth_is_refused(tmp_path: Path) -> None:
    result = invoke("dashboard", "--store", f"sqlite:///{tmp_path / 'x.db'}",
                    "--address", "0.0.0.0", "--port", "0")  # fmt: skip
    assert_one_error_line(
        result, 2, "--address 0.0.0.0 lets anyone who can reach it see and act on every run"
    )


def test_no_auth_on_an_exposed_address_warns(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(CliUsageError):
        check_exposure("10.1.2.3", None, no_auth=False)
    check_exposure("10.1.2.3", BasicAuth((("a", "b"),)), no_auth=False)
    with caplog.at_level(logging.WARNING, logger="pyrula.cli.dashboard"):
        check_exposure("10.1.2.3", None, no_auth=True)
    assert "listens on 10.1.2.3 without authentication" in caplog.text
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")


def test_bad_basic_auth_and_url_prefix_values_exit_2(tmp_path: Path) -> None:
    for flags, message in (
        (["--basic-auth", "justuser"], "--basic-auth takes user:password"),
        (["--url-prefix", "/a b"], "--url-prefix '/a b': give a plain path"),
    ):
        result = invoke("dashboard", "--store", f"sqlite:///{tmp_path / 'x.db'}", "--port", "0",
                        *flags)  # fmt: skip
        assert_one_error_line(result, 2, message)


APP = """
from pyrula_compat import Celery

app = Celery("flowerproj", broker="sqlite:///{db}")


@app.task
def add(x, y):
    return x + y
"""


def test_flower_serves_a_celery_apps_store_under_a_url_prefix(
    processes: Processes, tmp_path: Path
) -> None:
    db = tmp_path / "celery.db"
    (tmp_path / "flowerproj.py").write_text(textwrap.dedent(APP.format(db=db)))
    env = {"PYTHONPATH": f"{REPO_ROOT}:{tmp_path}"}
    worker = processes.start("worker", "-A", "flowerproj", "--claim-poll-interval", "0.05",
                             env=env)  # fmt: skip
    flower = processes.start("-A", "flowerproj", "flower", "--port", "0", "--url-prefix",
                             "flower/", "--basic-auth", "ops:pw", env=env)  # fmt: skip
    site = processes.listening(flower)
    site.credentials = ("ops", "pw")
    assert site.base.endswith("/flower")
    names = [w["name"] for w in site.get("/api/workflows").json()["workflows"]]
    assert "flowerproj.add" in names
    reply = site.post("/api/runs", {"workflow": "flowerproj.add", "params": {"args": [2, 3]}})
    assert reply.status == 201, reply.body
    done = site.wait_status(reply.json()["run"]["run_id"], "completed")
    assert done["run"]["result"] == 5
    page = site.get("/")
    assert page.status == 200 and 'href="/flower/runs/' in page.body
    assert 'src="/flower/static/app.js"' in page.body
    root = Dashboard(site.base.removesuffix("/flower"), site.process, site.credentials)
    outside = root.get("/api/runs")
    assert outside.status == 404 and "the dashboard is under /flower/" in outside.body
    assert worker.proc.poll() is None
