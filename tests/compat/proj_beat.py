"""A Celery-shaped app for ``pyrula beat -A proj_beat``: one beat entry every second.

The broker comes from ``CELERY_BROKER_URL``. Each tick appends a line to the file
``BEAT_TICKS`` names; ``beat_init`` (with what its sender carries) and ``worker_init``
are appended, as JSON lines, to the file ``BEAT_SIGNALS`` names.
"""

import json
import os
import time
from datetime import timedelta

from pyrula_compat import Celery, signals

app = Celery("proj_beat", broker="sqlite:///proj_beat.db")
app.conf.beat_schedule = {
    "tick-every-1s": {
        "task": "proj_beat.tick",
        "schedule": timedelta(seconds=1),
        "args": (os.environ.get("BEAT_TICKS", "ticks"),),
    },
}


@app.task(name="proj_beat.tick", bind=True)
def tick(self, path):
    with open(path, "a") as handle:
        handle.write(f"{time.time():.3f} {self.request.periodic_task_name}\n")


def _record(signal, **fields):
    if os.environ.get("BEAT_SIGNALS"):
        with open(os.environ["BEAT_SIGNALS"], "a") as handle:
            handle.write(json.dumps({"signal": signal, "pid": os.getpid(), **fields}) + "\n")


@signals.beat_init.connect
def on_beat_init(sender=None, **kwargs):
    _record(
        "beat_init",
        sender=type(sender).__name__,
        app=sender.app.main,
        max_interval=sender.max_interval,
        scheduler_cls=sender.scheduler_cls,
        schedule_filename=sender.schedule_filename,
    )


@signals.worker_init.connect
def on_worker_init(sender=None, **kwargs):
    _record("worker_init")
