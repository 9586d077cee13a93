"""Tasks as a Celery project writes them (only the imports changed)."""

import json
import os
import time

from pyrula_compat import Task, shared_task
from pyrula_compat.utils.log import get_task_logger

from .celery import app

logger = get_task_logger(__name__)


class ProjError(Exception):
    """A project-specific failure."""


def _append(path: str, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")


def _wait_for(path: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.02)


@app.task
def add(x, y):
    logger.info("adding %s and %s", x, y)
    return x + y


@app.task
def mul(x, y):
    return x * y


@shared_task
def tsum(numbers):
    return sum(numbers)


@app.task
def fail(message):
    raise ProjError(message)


@app.task(bind=True, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=3)
def flaky(self, failures):
    """Fails ``failures`` times with ConnectionError, then returns its retry count."""
    if self.request.retries < failures:
        raise ConnectionError(f"attempt {self.request.retries} failed")
    return self.request.retries


@app.task(bind=True, max_retries=2)
def retry_manually(self, failures, countdown=0.2):
    try:
        if self.request.retries < failures:
            raise OSError(f"disk busy on try {self.request.retries}")
    except OSError as exc:
        raise self.retry(exc=exc, countdown=countdown) from exc
    return {"retries": self.request.retries, "id": self.request.id}


@app.task(bind=True, max_retries=2)
def retry_without_raising(self, value):
    """``self.retry(args, kwargs, exc=..., throw=False)``: retried with new arguments
    once the body returns."""
    if self.request.retries == 0:
        self.retry(args=(value * 10,), exc=ValueError("again"), throw=False, countdown=0.1)
        return "discarded"
    return value


@app.task(bind=True, max_retries=1)
def retry_then_give_up(self):
    raise self.retry(countdown=0.1)


@app.task(bind=True)
def progress(self, gate):
    self.update_state(state="PROGRESS", meta={"done": 1, "total": 2})
    _wait_for(gate)
    return "finished"


@app.task(bind=True)
def request_info(self, *args, **kwargs):
    return {
        "id": self.request.id,
        "args": list(self.request.args),
        "kwargs": self.request.kwargs,
        "retries": self.request.retries,
        "is_eager": self.request.is_eager,
        "root_id": self.request.root_id,
        "parent_id": self.request.parent_id,
        "hostname": self.request.hostname,
        "origin": self.request.origin,
        "headers": self.request.headers,
    }


@app.task(bind=True, max_retries=None)
def retry_until_expired(self, path, countdown=0.3):
    """Logs each attempt's retry count to ``path`` and retries, forever (until its
    ``expires`` passes)."""
    _append(path, str(self.request.retries))
    raise self.retry(countdown=countdown)


@app.task(bind=True, autoretry_for=(ConnectionError,), retry_kwargs={"countdown": 0.3},
          max_retries=None)  # fmt: skip
def autoretry_until_expired(self, path):
    _append(path, str(self.request.retries))
    raise ConnectionError("still down")


@app.task
def slow(seconds, marker=None):
    if marker:
        _append(marker, f"start {os.getpid()}")
    time.sleep(seconds)
    return seconds


@app.task
def wait_gate(gate, marker):
    _append(marker, f"start {os.getpid()}")
    _wait_for(gate, 60)
    return os.getpid()


@app.task(bind=True)
def stop_chain(self, value):
    self.request.chain = None
    return value


@app.task
def record_error(request, exc, traceback, path):
    _append(path, json.dumps({"id": request.id, "error": repr(exc)}))


@app.task
def record(value, path):
    _append(path, json.dumps(value))
    return value


@app.task(bind=True)
def beat_tick(self, path):
    _append(path, f"{time.time():.3f} {self.request.periodic_task_name} {self.request.id}")


@app.task(rate_limit="5/s")
def limited(path):
    _append(path, f"{time.time():.3f}")


@app.task(soft_time_limit=0.5)
def cooperative_loop():
    from pyrula_compat.exceptions import SoftTimeLimitExceeded

    try:
        while True:
            sum(range(1000))
    except SoftTimeLimitExceeded:
        return "cleaned up"


class HookedTask(Task):
    def on_success(self, retval, task_id, args, kwargs):
        _append(kwargs["path"], f"success {retval}")

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        _append(kwargs["path"], f"failure {type(exc).__name__}")

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        _append(kwargs["path"], f"after_return {status}")


@app.task(base=HookedTask)
def hooked(value, path):
    if value < 0:
        raise ValueError("negative")
    return value


@app.task
def echo(value):
    return value


@app.task
def count_lengths(words):
    """How many words of each length (a dict with int keys)."""
    counts = {}
    for word in words:
        counts[len(word)] = counts.get(len(word), 0) + 1
    return counts


@app.task(bind=True)
def replace_with(self, kind, value, marker=None):
    """Replaces itself (``self.replace``) by a signature of ``kind``; ``marker`` logs
    each run of this body, with its pid and nesting."""
    from pyrula_compat import group

    if marker:
        _append(marker, f"replace {os.getpid()} {self.request.replaced_task_nesting}")
    if kind == "task":
        self.replace(add.s(value, 1))
    elif kind == "chain":
        self.replace(add.s(value, 1) | mul.s(10))
    elif kind == "group":
        self.replace(group(add.s(value, 1), mul.s(value, 2), add.s(value, 0) | mul.s(3)))
    elif kind == "fail":
        self.replace(fail.s(f"replacement of {value} failed"))
    elif kind == "gate":
        self.replace(wait_gate_id.s(value, marker))
    elif kind == "again":
        self.replace(replace_with.s("task", value, marker))
    elif kind == "nothing":
        self.replace(group())
    elif kind == "chunks":
        self.replace(add.chunks([(value, 1), (value, 2), (value, 3)], 2) | total.s())
    elif kind == "linked":
        self.replace(add.s(value, 1).set(link=record.s(marker)))
    elif kind == "chunks_alone":
        self.replace(add.chunks([(value, 1), (value, 2), (value, 3)], 2))
    elif kind.startswith("own_id"):  # replacements with task ids of their own
        own = f"{self.request.id}-own"
        self.replace(
            {
                "own_id": add.s(value, 1).set(task_id=own),
                "own_id_same": add.s(value, 1).set(task_id=self.request.id),
                "own_id_chain": add.s(value, 1).set(task_id=own) | fail.s().set(task_id=own + "2"),
                "own_id_group": group(add.s(value, 1).set(task_id=own), mul.s(value, 2)),
            }[kind]
        )
    if marker:
        _append(marker, "after replace")  # never: replace raises
    return "not replaced"


@app.task(bind=True)
def wait_gate_id(self, gate, marker):
    """Logs its run id and pid, waits for ``gate``, returns its run id."""
    _append(marker, f"start {os.getpid()} {self.request.id}")
    _wait_for(gate, 60)
    return self.request.id


@app.task
def total(lists):
    """The sum of a list of lists (what ``chunks`` gives)."""
    return sum(sum(part) for part in lists)


@app.task(bind=True)
def fan_out(self, n, kind="tasks"):
    """Sends work from its body (its ``children``): ``n`` adds, a group of them, a slow
    task, or an add not added to its children and a result added by hand; then stores
    its progress with ``backend.store_result`` and returns ``n``."""
    from pyrula_compat import group

    if kind == "tasks":
        for i in range(n):
            add.delay(i, i)
    elif kind == "group":
        group(add.s(i, i) for i in range(n)).delay()
    elif kind == "slow":
        slow.delay(n)
    elif kind == "trail":  # not added; then one added by hand
        add.apply_async((n, n), add_to_parent=False)
        self.add_trail(self.AsyncResult(f"{self.request.id}-manual"))
    self.backend.store_result(self.request.id, {"sent": n}, "PROGRESS")
    assert self.AsyncResult(self.request.id).info == {"sent": n}
    return n
