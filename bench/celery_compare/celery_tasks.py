"""The benchmark's sample tasks, written for Celery 5.

``pyrula_tasks.py`` is this file with ``celery`` rewritten to ``pyrula_compat`` in the
import lines and nothing else (the driver checks that before it starts): the migration
the shim promises. The broker and result backend are the same Valkey server, from
``BENCH_VALKEY_URL``; every setting is Celery's default except the JSON-only ones.
"""

import os
import time

from celery import Celery

URL = os.environ.get("BENCH_VALKEY_URL", "redis://127.0.0.1:6379/0")

app = Celery("bench", broker=URL, backend=URL)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task
def noop():
    """Nothing: all of its cost is the system's."""
    return None


@app.task
def add(x, y):
    """The link of the three-task chains."""
    return x + y


@app.task(bind=True, max_retries=1)
def fail_once(self):
    """Fails on its first attempt, asks to be retried at once, succeeds on the retry."""
    if self.request.retries == 0:
        raise self.retry(exc=ValueError("first attempt fails"), countdown=0)
    return self.request.retries


@app.task
def stamp():
    """When the body started, for countdown lateness (epoch seconds)."""
    return time.time()
