"""The overview (charts of the last hour), workers, queues, schedules, owners and dead
letters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from pyrula.cli.dashboard.charts import bar_chart
from pyrula.cli.dashboard.filters import DEFAULT_OWNER_SHOWN
from pyrula.cli.dashboard.pages import (
    Site,
    button,
    json_block,
    run_link,
    seconds,
    status,
    table,
    text,
)
from pyrula.workflows.records import RunStatus


def overview_live(site: Site, data: Mapping[str, Any]) -> str:
    buckets = data["buckets"]
    rate = data["failure_rate"]
    counts = data["counts"]
    tiles = " &middot; ".join(
        f'<a class="s-{s.value}" href="{escape(site.href("/?status=" + s.value))}">'
        f"{s.value} {counts.get(s.value, 0)}</a>"
        for s in RunStatus
    )
    summary = (
        f'<p id="summary">Last hour: <b>{data["ended"]}</b> runs ended, '
        f"<b>{data['failed']}</b> failed "
        f"({'-' if rate is None else f'{rate:.1%}'}); latency p50 "
        f"{seconds(data['latency_p50_s'])}, p95 {seconds(data['latency_p95_s'])}.</p>"
        f'<p class="counts">Now: {tiles}</p>'
    )
    charts = (
        '<div class="charts">'
        + bar_chart(
            "Throughput: runs ended per minute",
            [b["completed"] + b["failed"] + b["cancelled"] for b in buckets],
            color="#2b7bd6",
            shown=lambda v: f"{v:g}/min",
            chart_id="chart-throughput",
        )
        + bar_chart(
            "Failure rate per minute",
            [None if b["failure_rate"] is None else 100 * b["failure_rate"] for b in buckets],
            color="#c0392b",
            shown=lambda v: f"{v:.0f}%",
            chart_id="chart-failures",
        )
        + bar_chart(
            "Latency p95 (submit to end) per minute",
            [b["latency_p95_s"] for b in buckets],
            color="#8e44ad",
            shown=seconds,
            chart_id="chart-latency",
        )
        + "</div>"
    )
    return summary + charts


def workers_live(site: Site, workers: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            text(w["worker_id"]),
            '<span class="ok">live</span>'
            if w["alive"]
            else '<span class="err">dead (its heartbeats stopped: killed or stuck)</span>',
            text(w["hostname"]),
            text(w["pid"]),
            text(", ".join(w["workflows"])),
            text(w["running"]),
            f"{w['processed_1h']} / {w['failed_1h']} / {w['retried_1h']}",
            text(w["started_at"]),
            f"{text(w['last_seen'])} ({seconds(w['last_seen_ago_s'])} ago)",
        )
        for w in workers
    ]
    headers = ("Worker", "State", "Host", "PID", "Workflows", "In flight",
               "Ended / failed / re-claimed (1 h)", "Started", "Last heartbeat")  # fmt: skip
    api = escape(site.href("/api/workers"))
    return table(headers, rows, "no workers registered", table_id="workers") + (
        f'<p class="muted">The worker registry keeps liveness and runs in flight; the hour\'s '
        f'counts are read from the runs each worker ended. <a href="{api}">JSON</a></p>'
    )


def queues_live(site: Site, rows: Sequence[Mapping[str, Any]]) -> str:
    shown = [
        (
            f'<a href="{escape(site.href("/?status=queued&workflow=" + quote(r["queue"])))}">'
            f"{escape(r['queue'])}</a>",
            str(r["queued"]),
            str(r["delayed"]),
            str(r["running"]),
            seconds(r["oldest_wait_s"]),
            str(r["ended_5m"]),
            button(
                "Purge",
                "/api/queues/" + quote(r["queue"], safe="") + "/purge",
                confirm=f"Cancel every run of {r['queue']} that waits to start?",
            )
            if r["queued"] or r["delayed"]
            else "",
        )
        for r in rows
    ]
    headers = ("Queue (workflow)", "Waiting", "Delayed", "Running", "Oldest waiting",
               "Ended (5 min)", "")  # fmt: skip
    note = (
        '<p class="muted">Each workflow is a queue: workers claim by workflow name. '
        f'<a href="{escape(site.href("/api/queues"))}">JSON</a></p>'
    )
    return table(headers, shown, "no runs waiting or running", table_id="queues") + note


def schedules_live(site: Site, schedules: Sequence[Mapping[str, Any]]) -> str:
    rows = []
    for s in schedules:
        sid = s["schedule_id"]
        base = "/api/schedules/" + quote(sid, safe="")
        toggle = (
            button("Pause", base + "/pause", confirm=f"Pause schedule {sid}?", key="P")
            if s["enabled"]
            else button("Resume", base + "/resume", confirm=f"Resume schedule {sid}?", key="P")
        )
        last = s.get("last_run")
        rows.append(
            (
                text(sid),
                text(s["workflow"]),
                text(f"cron {s['cron']}" if s["cron"] is not None else f"every {s['every_s']:g}s"),
                text(s["timezone"]),
                '<span class="ok">active</span>' if s["enabled"] else "<b>paused</b>",
                text(s["overlap"]),
                text(s["next_fire_at"] if s["enabled"] else None),
                text(s["last_fire_at"]),
                (run_link(site, last["run_id"]) + " " + status(last["status"]))
                if last
                else text(s["last_run_id"]),
                json_block(s["params"]),
                toggle
                + " "
                + button(
                    "Run now", base + "/run-now", confirm=f"Start a run of {sid} now?", key="R"
                )
                + " "
                + button("Delete", base + "/delete", confirm=f"Delete schedule {sid}?"),
            )
        )
    headers = ("Schedule", "Workflow", "When", "Timezone", "State", "Overlap", "Next fire",
               "Last fire", "Last run", "Params", "")  # fmt: skip
    api = escape(site.href("/api/schedules"))
    return table(headers, rows, "no schedules", table_id="schedules") + (
        f'<p><a href="{api}">JSON</a></p>'
    )


def owners_live(site: Site, rows: Sequence[Mapping[str, Any]]) -> str:
    shown = [
        (
            f'<a href="{escape(site.href("/?owner=" + quote(r["owner"] or DEFAULT_OWNER_SHOWN)))}">'
            f"{escape(r['owner'] or '(default)')}</a>",
            str(r["queued"]),
            str(r["running"]),
            str(r["sleeping"]),
            str(r["waiting"]),
        )
        for r in rows
    ]
    headers = ("Owner", "Queued", "Running (in flight)", "Sleeping", "Waiting")
    return table(headers, shown, "no owner has runs waiting or running", table_id="owners") + (
        f'<p><a href="{escape(site.href("/api/owners"))}">JSON</a></p>'
    )


def dead_live(site: Site, runs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        (
            run_link(site, r["run_id"]),
            text(r["workflow"]),
            text(r["owner"] or "(default)"),
            text(r["recoveries"]),
            text(r["finished_at"]),
            text(r["error"]["message"] if r["error"] else None),
        )
        for r in runs
    ]
    headers = ("Run", "Workflow", "Owner", "Recoveries", "Ended", "Why")
    note = (
        '<p class="muted">A run is dead-lettered when it kept killing the workers that ran '
        "it. Retry it from its page once the cause is fixed, or all of them: "
        f'<a href="{escape(site.href("/?status=dead"))}">runs with status dead</a>.</p>'
    )
    return note + table(headers, rows, "no dead-lettered runs", table_id="dead")
