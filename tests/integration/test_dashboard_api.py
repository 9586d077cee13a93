"""``pyrula dashboard`` as a real process over its JSON API, on a SQLite file and on a
real valkey-server, with a real ``pyrula worker`` process serving the store.

One dashboard and one worker per store kind serve the module (started once, stopped by
PID at teardown); the tests act through ``/api`` and check what the store then holds.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.dashboard_processes import Dashboard, Processes, wait_for
from tests.integration.test_cli_worker import REPO_ROOT
from tests.valkey.servers import ValkeyProcess, fresh_namespace, valkey_server  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["sqlite", "valkey"])
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dashboard]:
    folder = tmp_path_factory.mktemp(f"dash-{request.param}")
    if request.param == "sqlite":
        url = f"sqlite:///{folder / 'pyrula.db'}"
    else:
        server: ValkeyProcess = request.getfixturevalue("valkey_server")
        url = f"{server.url}/0?namespace={fresh_namespace()}"
    processes = Processes(folder)
    try:
        processes.worker(url)
        yield processes.dashboard(url, "-w", "tests.fixtures.dashboard_workflows")
    finally:
        processes.stop_all()


def submit(site: Dashboard, workflow: str, params: dict[str, object], **extra: str) -> str:
    reply = site.post("/api/runs", {"workflow": workflow, "params": params, **extra})
    assert reply.status == 201, reply.body
    run_id: str = reply.json()["run"]["run_id"]
    return run_id


def test_every_page_is_html_and_an_unknown_run_is_a_404_page(site: Dashboard) -> None:
    for path in ("/", "/overview", "/workers", "/queues", "/schedules", "/owners", "/dead"):
        reply = site.get(path)
        assert reply.status == 200 and reply.content_type.startswith("text/html"), path
        assert '<div id="live">' in reply.body
    missing = site.get("/runs/no-such-run")
    assert missing.status == 404 and missing.content_type.startswith("text/html")
    assert "no run with id &#x27;no-such-run&#x27;" in missing.body
    assert "Traceback" not in missing.body
    api = site.get("/api/runs/no-such-run")
    assert api.status == 404 and api.json() == {"error": "no run with id 'no-such-run'",
                                                 "status": 404}  # fmt: skip
    assert site.get("/nowhere").status == 404


def test_a_run_shows_result_progress_journal_timeline_and_parent(site: Dashboard) -> None:
    parent = submit(site, "dash_parent", {"a": 41})
    done = site.wait_status(parent, "completed")
    assert done["run"]["result"] == {"sum": 42}
    (child,) = done["children"]
    assert child["workflow"] == "dash_add" and child["status"] == "completed"
    shown = site.wait_status(child["run_id"], "completed")
    assert shown["run"]["parent_run_id"] == parent
    assert shown["run"]["progress_state"] == "HALFWAY"
    assert shown["run"]["progress_info"] == {"done": 42}
    steps = [(e["position"], e["name"], e["ok"]) for e in shown["journal"]]
    assert steps == [(0, "add", True), (1, "report", True)]
    assert all(e["duration_s"] is not None and e["duration_s"] >= 0 for e in shown["journal"])
    page = site.get(f"/runs/{child['run_id']}").body
    assert "HALFWAY" in page and "&quot;sum&quot;: 42" in page
    assert f'href="/runs/{parent}"' in page


def test_retry_of_a_failed_run_succeeds_and_is_recorded(site: Dashboard, tmp_path: Path) -> None:
    marker = str(tmp_path / f"marker-{uuid.uuid4().hex}")
    run_id = submit(site, "dash_flaky", {"marker": marker})
    failed = site.wait_status(run_id, "failed")
    error = failed["run"]["error"]
    assert error["type"] == "builtins.ValueError" and "Traceback" in error["traceback"]
    assert not failed["journal"][-1]["ok"]
    reply = site.post(f"/api/runs/{run_id}/retry")
    assert reply.status == 200, reply.body
    done = site.wait_status(run_id, "completed")
    assert done["run"]["result"] == "fixed"
    assert [(a["action"], a["by"], a["detail"]) for a in done["actions"]] == [
        ("submit", "anonymous", {"params": {"marker": marker}}),
        ("retry", "anonymous", {"from": "failed", "to": "queued"}),
    ]


def test_a_retry_of_a_live_run_and_a_cancel_of_an_ended_one_change_nothing(
    site: Dashboard,
) -> None:
    done = submit(site, "dash_add", {"a": 1, "b": 2})
    site.wait_status(done, "completed")
    before = site.run(done)
    reply = site.post(f"/api/runs/{done}/cancel")
    assert reply.status == 409
    assert reply.json()["error"] == (
        f"run {done} already ended (completed): there is nothing to cancel; nothing changed"
    )
    assert site.post(f"/api/runs/{done}/terminate").status == 409
    assert site.run(done) == before
    waiting = submit(site, "dash_signal", {})
    site.wait_status(waiting, "waiting")
    reply = site.post(f"/api/runs/{waiting}/retry")
    assert reply.status == 409 and "only a run that ended" in reply.json()["error"]
    assert site.run(waiting)["run"]["status"] == "waiting"
    assert site.post("/api/runs/no-such-run/retry").status == 404
    assert site.post(f"/api/runs/{waiting}/explode").status == 400
    assert site.post(f"/api/runs/{waiting}/cancel").status == 200
    site.wait_status(waiting, "cancelled")


def test_a_signal_payload_that_is_not_json_is_refused_and_nothing_is_sent(
    site: Dashboard,
) -> None:
    run_id = submit(site, "dash_signal", {})
    site.wait_status(run_id, "waiting")
    reply = site.post(f"/api/runs/{run_id}/signal", {"name": "go", "payload_text": "{oops"})
    assert reply.status == 400 and "not valid JSON" in reply.json()["error"]
    time.sleep(0.3)
    still = site.run(run_id)
    assert still["run"]["status"] == "waiting" and still["signals"] == []
    assert [a["action"] for a in still["actions"]] == ["submit"]
    reply = site.post(f"/api/runs/{run_id}/signal", {"name": "go", "payload_text": '{"n": 7}'})
    assert reply.status == 200, reply.body
    done = site.wait_status(run_id, "completed")
    assert done["run"]["result"] == {"n": 7}
    assert [s["value"] for s in done["signals"]] == [{"n": 7}]
    assert done["actions"][-1]["detail"] == {"name": "go", "payload": {"n": 7}}


def test_params_that_do_not_parse_or_fit_store_nothing(site: Dashboard) -> None:
    key = f"k-{uuid.uuid4().hex}"
    reply = site.post("/api/runs", {"workflow": "dash_add", "params_text": '{"a": 1,',
                                    "idempotency_key": key})  # fmt: skip
    assert reply.status == 400 and reply.json()["error"].startswith("params is not valid JSON")
    reply = site.post("/api/runs", {"workflow": "dash_add", "params": {"a": 1, "zz": 2},
                                    "idempotency_key": key})  # fmt: skip
    assert reply.status == 400 and "its params are a, b, note" in reply.json()["error"]
    assert site.api(f"/runs?q={key}")["runs"] == []
    names = {w["name"]: w["params"] for w in site.api("/workflows")["workflows"]}
    assert names["dash_add"] == ["a", "b", "note"]


def test_filters_search_counts_and_pages(site: Dashboard) -> None:
    owner = f"tenant-{uuid.uuid4().hex[:8]}"
    key = f"idem-{uuid.uuid4().hex}"
    ids = [submit(site, "dash_add", {"a": i, "b": 0}, owner=owner) for i in range(5)]
    keyed = submit(site, "dash_add", {"a": 9, "b": 9}, owner=owner, idempotency_key=key)
    for run_id in [*ids, keyed]:
        site.wait_status(run_id, "completed")
    listed = site.api(f"/runs?owner={owner}&size=2")
    assert [r["run_id"] for r in listed["runs"]] == [keyed, ids[4]]
    assert listed["has_more"] and listed["total"] == 6
    assert listed["counts"] == {"completed": 6}
    last = site.api(f"/runs?owner={owner}&size=2&page=2")
    assert [r["run_id"] for r in last["runs"]] == [ids[1], ids[0]] and not last["has_more"]
    assert [r["run_id"] for r in site.api(f"/runs?q={key}")["runs"]] == [keyed]
    # an empty owner field (a form's) is no filter; the default owner is "(default)"
    assert [r["run_id"] for r in site.api(f"/runs?owner=&q={key}")["runs"]] == [keyed]
    assert site.api(f"/runs?owner=(default)&q={key}")["runs"] == []
    assert [r["run_id"] for r in site.api(f"/runs?q={ids[2]}")["runs"]] == [ids[2]]
    assert site.api(f"/runs?owner={owner}&status=failed")["runs"] == []
    worker = site.run(ids[0])["run"]["worker_id"]
    assert len(site.api(f"/runs?owner={owner}&worker={worker}")["runs"]) == 6
    assert site.api(f"/runs?owner={owner}&worker=nobody")["runs"] == []
    assert len(site.api(f"/runs?owner={owner}&within=600")["runs"]) == 6
    assert site.api(f"/runs?owner={owner}&until=2000-01-01T00:00")["runs"] == []
    assert site.get("/api/runs?status=nonsense").status == 400
    assert site.get("/api/runs?since=yesterday").status == 400
    assert site.get("/api/runs?size=0").status == 400


def test_bulk_cancel_of_a_filter_reports_progress(site: Dashboard) -> None:
    owner = f"bulk-{uuid.uuid4().hex[:8]}"
    ids = [submit(site, "dash_signal", {}, owner=owner) for _ in range(4)]
    for run_id in ids:
        site.wait_status(run_id, "waiting")
    reply = site.post("/api/bulk", {"action": "cancel", "filter": {"owner": owner}})
    assert reply.status == 202, reply.body
    job = reply.json()["job"]
    progress = wait_for(
        lambda: (p := site.api(f"/bulk/{job}"))["finished"] and p,
        30,
        "the bulk job",
        site.process,
    )
    assert (progress["selected"], progress["done"], progress["skipped"]) == (4, 4, 0)
    assert progress["percent"] == 100
    assert {site.run(r)["run"]["status"] for r in ids} == {"cancelled"}
    assert site.api(f"/runs?owner={owner}")["counts"] == {"cancelled": 4}
    again = site.post("/api/bulk", {"action": "cancel", "filter": {"owner": owner}}).json()
    final = wait_for(lambda: (p := site.api(f"/bulk/{again['job']}"))["finished"] and p, 30,
                     "the second bulk job", site.process)  # fmt: skip
    assert (final["done"], final["skipped"]) == (0, 4)
    assert site.post("/api/bulk", {"action": "delete", "filter": {}}).status == 400


def test_schedules_pause_resume_run_now_and_delete(site: Dashboard) -> None:
    from pyrula.workflows import Schedule, open_store
    from pyrula.workflows.stores.schedule_admin import run_blocking

    url = site.process.proc.args[site.process.proc.args.index("--store") + 1]  # type: ignore[union-attr,index]
    store = open_store(str(url))
    sid = f"nightly-{uuid.uuid4().hex[:6]}"
    run_blocking(store.open)
    try:
        store.schedule_create(  # type: ignore[attr-defined]
            Schedule(
                schedule_id=sid, workflow="dash_add", params={"a": 2, "b": 3}, cron="0 3 * * *"
            )
        )
    finally:
        run_blocking(store.close)
    row = site.api(f"/schedules/{sid}")
    assert row["enabled"] and row["overlap"] == "allow_all"
    paused = site.post(f"/api/schedules/{sid}/pause").json()["schedule"]
    assert paused["enabled"] is False
    assert "<b>paused</b>" in site.get("/schedules").body
    assert site.post(f"/api/schedules/{sid}/resume").json()["schedule"]["enabled"] is True
    started = site.post(f"/api/schedules/{sid}/run-now").json()["run"]
    assert site.wait_status(started["run_id"], "completed")["run"]["result"] == {"sum": 5}
    shown = site.api(f"/schedules/{sid}")
    assert [a["action"] for a in shown["actions"]] == ["pause", "resume", "run-now"]
    assert site.post(f"/api/schedules/{sid}/delete").status == 200
    assert site.get(f"/api/schedules/{sid}").status == 404
    assert site.post(f"/api/schedules/{sid}/pause").status == 404


def test_workers_queues_owners_and_overview(site: Dashboard, tmp_path: Path) -> None:
    owner = f"o-{uuid.uuid4().hex[:8]}"
    gate = tmp_path / "open"
    held = submit(site, "dash_gate", {"path": str(gate)}, owner=owner)
    site.wait_status(held, "running")
    # the registry learns what a worker runs at its next heartbeat
    live = wait_for(
        lambda: [w for w in site.api("/workers")["workers"] if w["alive"] and w["running"]],
        30,
        "a live worker with a run in flight",
        site.process,
    )
    assert live[0]["pid"] > 0 and live[0]["hostname"] and "dash_gate" in live[0]["workflows"]
    owners = {o["owner"]: o for o in site.api("/owners")["owners"]}
    assert owners[owner]["running"] == 1
    queues = {q["queue"]: q for q in site.api("/queues")["queues"]}
    assert queues["dash_gate"]["running"] >= 1
    gate.write_text("go")
    site.wait_status(held, "completed")
    overview = site.api("/overview")["overview"]
    assert overview["ended"] >= 1 and len(overview["buckets"]) >= 60
    assert sum(b["completed"] for b in overview["buckets"]) >= 1
    assert '<svg id="chart-throughput"' in site.get("/overview").body


def test_the_live_stream_sends_the_page_again_when_it_changes(
    site: Dashboard, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    run_id = submit(site, "dash_gate", {"path": str(gate)})
    site.wait_status(run_id, "running")
    host, port = site.base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"GET /api/live?path=/runs/{run_id} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        stream = conn.makefile("rb")
        assert b"text/event-stream" in b"".join(iter(stream.readline, b"\r\n"))
        events = _events(stream)
        assert 's-running">running' in next(events)
        gate.write_text("go")
        assert 's-completed">completed' in next(events)


def _events(stream: object) -> Iterator[str]:
    lines: list[str] = []
    for raw in iter(stream.readline, b""):  # type: ignore[attr-defined]
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            lines.append(line[6:])
        elif line == "" and lines:
            yield "\n".join(lines)
            lines = []


def test_a_cross_site_or_non_json_post_is_refused(site: Dashboard) -> None:
    run_id = submit(site, "dash_signal", {})
    site.wait_status(run_id, "waiting")
    evil = site.post(f"/api/runs/{run_id}/cancel", headers={"Origin": "http://evil.example"})
    assert evil.status == 403
    form = site.request("POST", f"/api/runs/{run_id}/cancel", None,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert form.status == 415
    assert site.run(run_id)["run"]["status"] == "waiting"
    assert json.loads(site.post(f"/api/runs/{run_id}/cancel").body)["run"]["status"] == "cancelled"


def test_purging_a_queue_cancels_the_runs_waiting_to_start(site: Dashboard) -> None:
    workflow = f"dash_unserved_{uuid.uuid4().hex[:6]}"
    ids = [submit(site, workflow, {"i": i}) for i in range(3)]
    reply = site.post(f"/api/queues/{workflow}/purge")
    assert reply.status == 200 and reply.json() == {"queue": workflow, "purged": 3}
    assert {site.run(r)["run"]["status"] for r in ids} == {"cancelled"}
    assert site.post(f"/api/queues/{workflow}/purge").json()["purged"] == 0


def test_the_api_example_retries_every_failed_run(site: Dashboard, tmp_path: Path) -> None:
    markers = [str(tmp_path / f"m-{uuid.uuid4().hex}") for _ in range(2)]
    ids = [submit(site, "dash_flaky", {"marker": m}) for m in markers]
    for run_id in ids:
        site.wait_status(run_id, "failed")
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "examples" / "dashboard_api.py"),
            site.base,
            "--workflow",
            "dash_flaky",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert {f"retried {run_id}: queued" for run_id in ids} <= set(proc.stdout.splitlines())
    for run_id in ids:
        assert site.wait_status(run_id, "completed")["run"]["result"] == "fixed"
