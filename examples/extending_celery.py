"""Extending Celery's classes with pyrula_compat: a ContextTask base, a singleton Task
base and a bootstep, as a Celery project writes them.

    python examples/extending_celery.py

It serves the app with ``start_worker`` (a worker on a thread of this process, on a
temporary SQLite file), calls the tasks, checks what happened and exits 0. In production
the same app runs under ``pyrula worker -A extending_celery --heartbeat-file PATH``.
See docs/coming-from-celery.md, "Extending Celery's classes".
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from pyrula_compat import Celery, bootsteps
from pyrula_compat.contrib.testing.worker import start_worker

folder = tempfile.mkdtemp()
app = Celery("extending", broker=f"sqlite:///{folder}/extending.db")
scope: contextvars.ContextVar[str | None] = contextvars.ContextVar("scope", default=None)


@contextlib.contextmanager
def request_scope() -> Iterator[None]:
    """What ``flask_app.app_context()`` is in a Flask project."""
    token = scope.set("open")
    try:
        yield
    finally:
        scope.reset(token)


# --8<-- [start:context]
class ContextTask(app.Task):
    def __call__(self, *args, **kwargs):
        with request_scope():  # Flask: with flask_app.app_context():
            return self.run(*args, **kwargs)


app.Task = ContextTask  # the base of every task the app creates from here on


@app.task
def report(order_id):
    return {"order": order_id, "scope": scope.get()}


# --8<-- [end:context]


# --8<-- [start:singleton]
class Singleton(app.Task):
    """One run per arguments: the task id is made of them, and pyrula returns the run
    already sent under an id instead of starting another."""

    def apply_async(self, args=None, kwargs=None, **options):
        key = "-".join(str(arg) for arg in args or ())
        return super().apply_async(args, kwargs, task_id=f"{self.name}:{key}", **options)


@app.task(base=Singleton)
def rebuild_index(shop_id):
    return f"index of shop {shop_id} rebuilt"


# --8<-- [end:singleton]


# --8<-- [start:bootstep]
app.user_options["worker"].add(
    click.Option(["--heartbeat-file"], default=None, help="A file the worker touches.")
)


class Heartbeat(bootsteps.StartStopStep):
    """Writes a file while the worker runs (a container's liveness probe reads it)."""

    def __init__(self, worker, heartbeat_file=None, **options):
        self.path = heartbeat_file or os.path.join(folder, "alive")

    def start(self, worker):
        with open(self.path, "w") as out:
            out.write(f"{worker.hostname} serves {worker.app.main}\n")

    def stop(self, worker):
        os.remove(self.path)


app.steps["worker"].add(Heartbeat)
# --8<-- [end:bootstep]


def main() -> None:
    alive = os.path.join(folder, "alive")
    with start_worker(app, perform_ping_check=False):
        assert os.path.exists(alive), "the bootstep started with the worker"
        print("heartbeat:", Path(alive).read_text().strip())
        print("report:", report.delay(42).get(timeout=30))
        first = rebuild_index.delay(7)
        again = rebuild_index.delay(7)
        print("singleton:", first.id, "==", again.id, "->", again.get(timeout=30))
        result: Any = report.delay(43).get(timeout=30)
        assert result == {"order": 43, "scope": "open"}
        assert first.id == again.id == "extending.rebuild_index:7"
    assert not os.path.exists(alive), "the bootstep stopped with the worker"
    print("heartbeat file removed at the stop")


if __name__ == "__main__":
    main()
