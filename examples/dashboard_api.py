"""Scripting the dashboard's JSON API: retry every failed run of a workflow.

    pyrula dashboard --store sqlite:///pyrula.db &
    python examples/dashboard_api.py http://127.0.0.1:5555 --workflow checkout [--user ops:pw]

It pages through ``GET /api/runs?status=failed&workflow=...`` and sends ``POST
/api/runs/ID/retry`` for each run, printing one line per run; a run that moved on in the
meantime is refused with a message (409) and left as it is. Each retry is recorded in
the run's history with the dashboard user's name. Only the standard library. See
docs/dashboard.md ("The JSON API").
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def call(base: str, path: str, user: str | None, body: Any = None) -> tuple[int, Any]:
    """One API request; returns its status and its JSON document."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(user.encode()).decode()
    request = urllib.request.Request(base + path, data, headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def failed_runs(base: str, workflow: str, user: str | None) -> list[str]:
    """Every failed run of ``workflow``, newest first (read before any is retried)."""
    ids: list[str] = []
    page = 0
    while True:
        query = urllib.parse.urlencode(
            {"status": "failed", "workflow": workflow, "size": 200, "page": page}
        )
        status, document = call(base, f"/api/runs?{query}", user)
        if status != 200:
            sys.exit(f"listing failed runs: {document['error']}")
        ids.extend(run["run_id"] for run in document["runs"])
        if not document["has_more"]:
            return ids
        page += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the dashboard's address, with its --url-prefix")
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--user", help="USER:PASS for a dashboard started with --basic-auth")
    args = parser.parse_args()
    base = args.base.rstrip("/")
    for run_id in failed_runs(base, args.workflow, args.user):
        status, document = call(base, f"/api/runs/{run_id}/retry", args.user, {})
        if status == 200:
            print(f"retried {run_id}: {document['run']['status']}")
        else:
            print(f"left {run_id}: {document['error']}")


if __name__ == "__main__":
    main()
