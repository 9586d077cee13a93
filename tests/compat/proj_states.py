"""A small Celery-style app for ``test_states_pending.py``, served as ``pyrula worker -A
proj_states``: tasks that wait for a gate file, so a test reads their state while they
run. ``PROJ_TRACK_STARTED=1`` turns ``task_track_started`` on for the app."""

import os
import time

from pyrula_compat import Celery

app = Celery("proj_states", broker="sqlite:///proj_states.db")
app.conf.task_track_started = bool(os.environ.get("PROJ_TRACK_STARTED"))


def _wait(gate, marker):
    with open(marker, "a") as handle:
        handle.write(f"start {os.getpid()}\n")
    deadline = time.monotonic() + 60
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)


@app.task(name="proj_states.gated")
def gated(gate, marker):
    _wait(gate, marker)
    return "done"


@app.task(name="proj_states.gated_tracked", track_started=True)
def gated_tracked(gate, marker):
    _wait(gate, marker)
    return "tracked"


@app.task(name="proj_states.retry_then_gated", bind=True, max_retries=1)
def retry_then_gated(self, gate, marker):
    if not self.request.retries:
        raise self.retry(countdown=0.1)
    _wait(gate, marker)
    return self.request.retries
