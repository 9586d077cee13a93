"""``pyrula dashboard`` and ``pyrula worker`` as real processes for the dashboard tests.

Each process is started with its output in files and stopped by its own PID (SIGTERM,
then SIGKILL if it does not exit). The HTTP helpers speak to the dashboard with urllib.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_worker import REPO_ROOT, pyrula_command

MODULE = "tests.fixtures.dashboard_workflows"
START_TIMEOUT = 30.0
LISTENING = re.compile(r"dashboard on (http://127\.0\.0\.1:(\d+)(/[^ ]*)?/) ")


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@dataclass
class Processes:
    """Starts pyrula processes in ``folder``; :meth:`stop_all` stops those still running."""

    folder: Path
    started: list[Process] = field(default_factory=list)

    def start(self, *args: str, env: dict[str, str] | None = None) -> Process:
        n = len(self.started)
        out, err = self.folder / f"proc{n}.out", self.folder / f"proc{n}.err"
        environ = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        environ.pop("PYRULA_STORE_URL", None)
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                [*pyrula_command(), *args],
                cwd=REPO_ROOT,
                env=environ,
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
            )
        started = Process(proc, out, err)
        self.started.append(started)
        return started

    def worker(self, store_url: str, *flags: str) -> Process:
        worker = self.start(
            "worker", "--workflow", MODULE, "--store", store_url,
            "--claim-poll-interval", "0.05", "--timer-poll-interval", "0.5", "--lock-ttl", "3",
            *flags,
        )  # fmt: skip
        wait_for(lambda: "pyrula worker" in worker.stdout, START_TIMEOUT, "the worker", worker)
        return worker

    def dashboard(self, store_url: str, *flags: str) -> Dashboard:
        return self.listening(self.start("dashboard", "--store", store_url, "--port", "0", *flags))

    def listening(self, shown: Process) -> Dashboard:
        """The dashboard ``shown`` serves, once its first line says where."""
        found: list[re.Match[str]] = []

        def listening() -> bool:
            match = LISTENING.search(shown.stdout)
            if match:
                found.append(match)
            return match is not None

        wait_for(listening, START_TIMEOUT, "the dashboard's address", shown)
        return Dashboard(found[0].group(1).rstrip("/"), shown)

    def stop_all(self) -> None:
        for started in reversed(self.started):
            started.stop()


def wait_for(check: Callable[[], Any], timeout: float, what: str, proc: Process) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if proc.proc.poll() is not None:
            pytest.fail(f"{what}: the process exited {proc.proc.returncode}:\n{proc.stderr}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not seen within {timeout}s:\n{proc.stdout}\n{proc.stderr}")
        time.sleep(0.05)


@dataclass
class Reply:
    status: int
    content_type: str
    body: str

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Dashboard:
    """A running ``pyrula dashboard`` at ``base`` (no trailing slash)."""

    base: str
    process: Process
    credentials: tuple[str, str] | None = None

    def request(
        self,
        method: str,
        path: str,
        document: Any = None,
        *,
        headers: dict[str, str] | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> Reply:
        data = None if document is None else json.dumps(document).encode()
        sent = {"Content-Type": "application/json"} if data is not None else {}
        given = credentials or self.credentials
        if given is not None:
            token = base64.b64encode(f"{given[0]}:{given[1]}".encode()).decode()
            sent["Authorization"] = f"Basic {token}"
        sent.update(headers or {})
        request = urllib.request.Request(self.base + path, data, sent, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return Reply(
                    response.status, response.headers["Content-Type"], response.read().decode()
                )
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, exc.headers.get("Content-Type", ""), exc.read().decode())

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, document: Any = None, **kwargs: Any) -> Reply:
        return self.request("POST", path, {} if document is None else document, **kwargs)

    def api(self, path: str) -> Any:
        reply = self.get("/api" + path)
        assert reply.status == 200, reply.body
        return reply.json()

    def run(self, run_id: str) -> dict[str, Any]:
        document: dict[str, Any] = self.api(f"/runs/{run_id}")
        return document

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            document = self.run(run_id)
            if document["run"]["status"] in statuses:
                return document
            if time.monotonic() > deadline:
                pytest.fail(f"run {run_id} is {document['run']['status']}, not {statuses}")
            time.sleep(0.05)
