"""An app whose ``beat_schedule`` holds one invalid entry, picked by ``PROJ_BAD_ENTRY``,
for ``test_beat_validation.py`` (served as ``pyrula worker -A proj_badbeat``)."""

import os
from datetime import timedelta

from pyrula_compat import Celery

app = Celery("proj_badbeat", broker="sqlite:///proj_badbeat.db")


@app.task(name="proj_badbeat.tick")
def tick():
    return 1


BAD = {
    "every-zero": {"task": "proj_badbeat.tick", "schedule": 0},
    "negative": {"task": "proj_badbeat.tick", "schedule": -5.0},
    "zero-timedelta": {"task": "proj_badbeat.tick", "schedule": timedelta(0)},
    "unknown-type": {"task": "proj_badbeat.tick", "schedule": "every minute"},
    "not-a-dict": 5,
}
kind = os.environ.get("PROJ_BAD_ENTRY")
app.conf.beat_schedule = {kind: BAD[kind]} if kind else {}
