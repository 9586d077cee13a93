"""A sample project with a Flask-style ContextTask base, worker and consumer bootsteps
and a worker user option, served by ``pyrula worker -A proj_steps`` in
tests/compat/test_bootsteps.py. Each step appends what happens to it to the file
named by the ``--steps-log`` option; ``PROJ_STEPS_FAIL=1`` adds a step whose start
raises."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import click

from pyrula_compat import Celery, bootsteps

app = Celery("proj_steps")
app.user_options["worker"].add(
    click.Option(["--steps-log"], default=None, help="Where the bootsteps write.")
)
_context = threading.local()


@contextlib.contextmanager
def app_context() -> Iterator[None]:
    """What Flask's ``app.app_context()`` is to a Flask project."""
    _context.active = True
    try:
        yield
    finally:
        _context.active = False


class ContextTask(app.Task):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with app_context():
            return self.run(*args, **kwargs)


app.Task = ContextTask


def _write(path: str | None, line: str) -> None:
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


class Recorder(bootsteps.StartStopStep):
    """A worker step: gets the worker as parent and the worker's options."""

    def __init__(self, worker: Any, steps_log: str | None = None, **options: Any) -> None:
        self.path = steps_log
        _write(self.path, f"init worker={worker.hostname} loglevel={options.get('loglevel')}")

    def start(self, worker: Any) -> None:
        _write(self.path, f"start app={worker.app.main}")

    def stop(self, worker: Any) -> None:
        _write(self.path, "stop")


class AfterRecorder(bootsteps.StartStopStep):
    requires = ("proj_steps:Recorder",)

    def __init__(self, worker: Any, steps_log: str | None = None, **options: Any) -> None:
        self.path = steps_log

    def start(self, worker: Any) -> None:
        _write(self.path, "start after")

    def stop(self, worker: Any) -> None:
        _write(self.path, "stop after")


class ConsumerRecorder(bootsteps.StartStopStep):
    def __init__(self, consumer: Any, steps_log: str | None = None, **options: Any) -> None:
        self.path = steps_log

    def start(self, consumer: Any) -> None:
        _write(self.path, f"start consumer of {consumer.controller.hostname}")

    def stop(self, consumer: Any) -> None:
        _write(self.path, "stop consumer")


class LicenseCheck(bootsteps.StartStopStep):
    """Fails to start (with PROJ_STEPS_FAIL=1)."""

    def start(self, worker: Any) -> None:
        raise RuntimeError("license server unreachable")


app.steps["worker"].update({AfterRecorder, Recorder})
app.steps["consumer"].add(ConsumerRecorder)
if os.environ.get("PROJ_STEPS_FAIL"):
    app.steps["worker"].add(LicenseCheck)


@app.task(bind=True, name="proj_steps.where")
def where(self: Any, x: int) -> dict[str, Any]:
    return {"x": x, "in_context": bool(getattr(_context, "active", False)), "id": self.request.id}
