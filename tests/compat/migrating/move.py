"""The two sides of a migration for the tests: the old Celery broker (a key prefix of its
own on the shared valkey-server, fed by processes running real Celery), the new pyrula
store (a SQLite file), and the log every task body appends to. Every process started here
is stopped by its PID."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import valkey

from tests.compat.conftest import REPO_ROOT, pyrula_command, wait_until
from tests.compat.real_celery import celery_dir

APP = "tests.compat.migrating.tasks"


class Move:
    """One migration: the old Celery broker (a key prefix of its own on the shared
    valkey-server), the new pyrula store (a SQLite file), the task log."""

    def __init__(self, tmp: Path, server_url: str) -> None:
        self.tmp = tmp
        self.prefix = f"m{uuid.uuid4().hex[:8]}:"
        self.old = f"{server_url}/0"
        self.store = f"sqlite:///{tmp / 'pyrula.db'}"
        self.log = tmp / "tasks.log"
        self.redis = valkey.Valkey.from_url(self.old)
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, side: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYRULA_STORE_URL",)}
        path = [str(REPO_ROOT)]
        if side == "celery":
            path.insert(0, str(celery_dir()))
        env.update(
            PYTHONPATH=os.pathsep.join(path),
            MIGRATE_BROKER=self.old if side == "celery" else self.store,
            MIGRATE_PREFIX=self.prefix,
            MIGRATE_LOG=str(self.log),
            MIGRATE_CELERY_DELAY="0.03",
        )
        return env

    def publish(self, code: str) -> None:
        """Run ``code`` in a process of the old deployment (``tasks`` imported)."""
        script = f"from {APP} import *\nfrom datetime import datetime, timedelta, UTC\n{code}"
        done = subprocess.run(
            [sys.executable, "-c", script], env=self.env("celery"), capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def migrate(self, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*pyrula_command(), "migrate", "celery", "-A", APP, "--from", self.old, *flags],
            env=self.env("pyrula"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def start(self, argv: list[str], side: str, name: str) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{name}.out").open("wb") as out:
            proc = subprocess.Popen(
                argv, env=self.env(side), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=self.tmp,
            )  # fmt: skip
        self.procs.append(proc)
        return proc

    def pyrula_worker(self) -> subprocess.Popen[bytes]:
        argv = [*pyrula_command(), "worker", "-A", APP, "--claim-poll-interval", "0.05",
                "--timer-poll-interval", "0.2", "-c", "8"]  # fmt: skip
        return self.start(argv, "pyrula", "pyrula-worker")

    def celery_worker(self) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "celery", "-A", APP, "worker", "--pool", "threads",
                "-c", "4", "-l", "info", "-Q", "celery", "--without-gossip",
                "--without-mingle", "--without-heartbeat"]  # fmt: skip
        proc = self.start(argv, "celery", "celery-worker")
        wait_until(lambda: "ready." in self.output("celery-worker"), 60, "celery worker ready")
        return proc

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text(errors="replace")

    def ran(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    def depth(self, queue: str = "celery") -> int:
        return int(self.redis.llen(self.prefix + queue))

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for key in self.redis.scan_iter(match=self.prefix + "*"):
            self.redis.delete(key)
        self.redis.close()
