"""One task module for both sides of a migration: under real Celery when Celery is
importable (the old workers and the publishing process, started with Celery on their
path), else under pyrula_compat (``pyrula worker -A`` and ``pyrula migrate``).

``MIGRATE_BROKER`` is the side's broker (Celery's Redis, or pyrula's store);
``MIGRATE_PREFIX`` the Celery transport's key prefix (each test its own);
``MIGRATE_RESULTS`` set gives the Celery side its Redis result backend;
``MIGRATE_CELERY_DELAY`` seconds every body takes under Celery (old workers that keep
consuming while the adoption runs); every body
appends one JSON line to ``MIGRATE_LOG`` (``O_APPEND``: one write per line, safe across
processes), so a test counts how often each task ran, and where.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

try:
    from celery import Celery

    SIDE = "celery"
except ImportError:
    from pyrula_compat import Celery

    SIDE = "pyrula"

app = Celery("migrating", broker=os.environ["MIGRATE_BROKER"])
app.conf.broker_transport_options = {"global_keyprefix": os.environ.get("MIGRATE_PREFIX", "")}
app.conf.task_routes = {"migrating.routed": {"queue": "routed"}}
if SIDE == "celery" and os.environ.get("MIGRATE_RESULTS"):  # the old Redis result backend
    app.conf.result_backend = os.environ["MIGRATE_BROKER"]
    app.conf.result_backend_transport_options = {
        "global_keyprefix": os.environ.get("MIGRATE_PREFIX", "")
    }
elif SIDE == "celery":
    app.conf.result_backend = None
    app.conf.task_ignore_result = True


def _log(self: Any, name: str, value: Any) -> None:
    if SIDE == "celery":
        time.sleep(float(os.environ.get("MIGRATE_CELERY_DELAY") or 0))
    line = {
        "task": name, "id": self.request.id, "side": SIDE, "at": time.time(),
        "retries": self.request.retries, "value": value,
    }  # fmt: skip
    fd = os.open(os.environ["MIGRATE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@app.task(bind=True, name="migrating.add")
def add(self: Any, x: int, y: int) -> int:
    _log(self, "add", x + y)
    return x + y


@app.task(bind=True, name="migrating.record")
def record(self: Any, tag: str, **extra: Any) -> str:
    _log(self, "record", {"tag": tag, **extra})
    return tag


@app.task(bind=True, name="migrating.routed")
def routed(self: Any, tag: str) -> str:
    _log(self, "routed", tag)
    return tag


@app.task(bind=True, name="migrating.boom")
def boom(self: Any, what: str) -> None:
    _log(self, "boom", what)
    raise ValueError(f"bad {what}")


@app.task(bind=True, name="migrating.flaky", max_retries=3)
def flaky(self: Any, tag: str) -> str:
    """Fails until its third attempt (retries 0 and 1 retry, 2 succeeds)."""
    _log(self, "flaky", tag)
    if self.request.retries < 2:
        raise self.retry(countdown=0.2)
    return tag
