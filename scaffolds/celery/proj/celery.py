"""The app. No broker URL: the embedded SQLite store (pyrula.db in this folder).

Point it at Valkey/Redis with Celery(..., broker="redis://localhost:6379/0") or the
CELERY_BROKER_URL environment variable; every worker and caller then shares that store.
"""

from datetime import timedelta

from pyrula_compat import Celery

app = Celery("proj", include=["proj.tasks"])
app.conf.update(
    timezone="UTC",
    beat_schedule={
        # Synced to the store when `pyrula worker -A proj` starts; no beat process.
        "heartbeat": {"task": "proj.tasks.add", "schedule": timedelta(minutes=5), "args": (0, 0)},
    },
)
