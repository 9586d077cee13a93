"""Tasks and signal receivers for ``test_worker_task_lifecycle.py``, imported by the workers those
tests start (``--workflow proj_worker``) and by the test process (to call the tasks).

With ``SIGNAL_LOG=<path>`` in its environment (only the workers have it), the process
appends one JSON line per ``task_received``/``task_revoked``/``task_unknown`` to
``<path>``.
"""

import json
import os
import time

from proj.celery import app

from pyrula_compat import signals
from pyrula_compat.contrib.abortable import AbortableTask
from pyrula_compat.result import AsyncResult


def _append(path, line):
    with open(path, "a") as handle:
        handle.write(line + "\n")


def _wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@app.task(name="proj_worker.broken_errback")
def broken_errback(request, exc, traceback, path):
    """A new-style errback that raises; logs each run and the failed task's state."""
    _append(path, json.dumps({"id": request.id, "state": AsyncResult(request.id).state}))
    raise RuntimeError("errback bug")


@app.task(name="proj_worker.broken_link")
def broken_link(value, path):
    _append(path, json.dumps(value))
    raise RuntimeError("link bug")


@app.task(bind=True, name="proj_worker.request_times", max_retries=1)
def request_times(self, retry_after=None):
    """``self.request.eta``/``expires`` of each attempt; retries once if asked."""
    seen = {"eta": self.request.eta, "expires": self.request.expires}
    if retry_after is not None and self.request.retries == 0:
        raise self.retry(countdown=retry_after)
    return {"retries": self.request.retries, **seen}


@app.task(bind=True, name="proj_worker.gated", max_retries=1)
def gated(self, gate, marker, retry=False):
    """Logs its start, waits for ``gate``, then retries once at once if asked."""
    _append(marker, f"start {self.request.retries}")
    _wait_for(gate)
    if retry and self.request.retries == 0:
        raise self.retry(countdown=0.5)
    return "done"


@app.task(bind=True, name="proj_worker.retry_later", max_retries=1)
def retry_later(self, value):
    """Retries with ``value * 10`` in two minutes (an inspect test revokes it first)."""
    if self.request.retries == 0:
        raise self.retry(args=(value * 10,), countdown=120)
    return value


class Stoppable(app.Task):
    """Logs ``success`` when ``on_success`` runs (it must not, for a terminated task)."""

    def on_success(self, retval, task_id, args, kwargs):
        _append(args[0], "success")


@app.task(base=Stoppable, name="proj_worker.stoppable")
def stoppable(marker):
    """Ticks for up to 20 s, swallowing every Exception, then logs that it finished."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            _append(marker, "tick")
            time.sleep(0.05)
        except Exception:
            pass
    _append(marker, "finished")
    return "finished"


@app.task(name="proj_worker.spin")
def spin(seconds):
    """Busy for ``seconds``; ``soft`` if a soft time limit stopped it first."""
    from pyrula_compat.exceptions import SoftTimeLimitExceeded

    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            sum(range(1000))
    except SoftTimeLimitExceeded:
        return "soft"
    return "no limit"


@app.task(bind=True, base=AbortableTask, name="proj_worker.abortable")
def abortable(self, marker):
    """Ticks until aborted (at most 20 s); returns how it ended."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if self.is_aborted():
            _append(marker, "aborted")
            return "aborted"
        _append(marker, "tick")
        time.sleep(0.05)
    return "finished"


_SIGNALS = os.environ.get("SIGNAL_LOG")
if _SIGNALS:

    @signals.task_received.connect
    def on_received(sender=None, request=None, **kwargs):
        _append(
            _SIGNALS,
            json.dumps(
                {
                    "signal": "task_received",
                    "sender": type(sender).__name__,
                    "id": request.id,
                    "name": request.name,
                    "task": request.task.name,
                    "args": list(request.args),
                    "eta": request.eta,
                }
            ),
        )

    @signals.task_revoked.connect
    def on_revoked(sender=None, request=None, terminated=None, signum=None, expired=None, **kw):
        _append(
            _SIGNALS,
            json.dumps(
                {
                    "signal": "task_revoked",
                    "sender": sender.name,
                    "id": request.id,
                    "terminated": terminated,
                    "signum": signum,
                    "expired": expired,
                    **({"args": list(request.args)} if request.args is not None else {}),
                }
            ),
        )

    @signals.task_unknown.connect
    def on_unknown(sender=None, name=None, id=None, message=None, exc=None, **kwargs):
        _append(
            _SIGNALS,
            json.dumps(
                {
                    "signal": "task_unknown",
                    "sender": type(sender).__name__,
                    "id": id,
                    "name": name,
                    "exc": type(exc).__name__,
                }
            ),
        )
