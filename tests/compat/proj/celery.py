"""The app, as in a Celery project's ``proj/celery.py``.

The broker comes from ``CELERY_BROKER_URL`` (the tests set it per store), as it can in
Celery; ``PROJ_BEAT=1`` turns the beat schedule on, ``PROJ_RESULT_EXPIRES`` sets
``result_expires`` (seconds); with ``SIGNAL_LOG=<path>`` the worker-start signals a
project connects here (logging, ``celeryd_after_setup``) are logged to ``<path>``.
"""

import os
from datetime import timedelta

from pyrula_compat import Celery, signals
from pyrula_compat.schedules import crontab

app = Celery("proj", broker="sqlite:///proj.db", include=["proj.tasks"])
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    timezone="UTC",
    task_default_queue="default",
)
if os.environ.get("PROJ_RESULT_EXPIRES"):
    app.conf.result_expires = timedelta(seconds=float(os.environ["PROJ_RESULT_EXPIRES"]))
if os.environ.get("PROJ_BEAT"):
    app.conf.beat_schedule = {
        "tick-every-2s": {
            "task": "proj.tasks.beat_tick",
            "schedule": timedelta(seconds=2),
            "args": (os.environ["PROJ_BEAT"],),
        },
        "nightly-report": {
            "task": "proj.tasks.add",
            "schedule": crontab(minute=0, hour=3, day_of_week="mon", day_of_month="1-7"),
            "args": (1, 2),
        },
    }

if os.environ.get("SIGNAL_LOG"):

    def _log_start_signal(signal, **fields):
        import json

        with open(os.environ["SIGNAL_LOG"], "a") as handle:
            handle.write(json.dumps({"signal": signal, "id": "start", **fields}) + "\n")

    @signals.after_setup_logger.connect
    def on_logger(sender=None, logger=None, loglevel=None, **kwargs):
        _log_start_signal("after_setup_logger", logger=logger.name, loglevel=loglevel)

    @signals.after_setup_task_logger.connect
    def on_task_logger(sender=None, logger=None, loglevel=None, **kwargs):
        _log_start_signal("after_setup_task_logger", logger=logger.name, loglevel=loglevel)

    @signals.celeryd_after_setup.connect
    def on_after_setup(sender=None, instance=None, conf=None, **kwargs):
        _log_start_signal("celeryd_after_setup", timezone=conf.timezone)
