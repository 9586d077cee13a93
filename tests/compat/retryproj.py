"""A Celery-shaped app whose tasks fail until a marker file exists, for the retry tests.

The store comes from ``CELERY_BROKER_URL``; each task appends a line to ``<path>.log``
every time its body runs, and to ``<path>.hooks`` for each hook that runs.
"""

import os
from pathlib import Path

from pyrula_compat import Celery, Task

app = Celery("retryproj", broker=os.environ.get("CELERY_BROKER_URL", "memory://"))


def _append(path: str, line: str) -> None:
    with open(path, "a") as out:
        out.write(line + "\n")


class Hooked(Task):
    def on_failure(self, exc, task_id, args, kwargs, einfo):  # type: ignore[no-untyped-def]
        _append(f"{args[0]}.hooks", f"on_failure {type(exc).__name__}")

    def on_retry(self, exc, task_id, args, kwargs, einfo):  # type: ignore[no-untyped-def]
        _append(f"{args[0]}.hooks", f"on_retry {type(exc).__name__}")

    def on_success(self, retval, task_id, args, kwargs):  # type: ignore[no-untyped-def]
        _append(f"{args[0]}.hooks", "on_success")


@app.task(name="retryproj.until_fixed", base=Hooked)
def until_fixed(path: str) -> str:
    """Fails with ValueError until ``<path>.fixed`` exists, then returns its text."""
    _append(f"{path}.log", "ran")
    fixed = Path(f"{path}.fixed")
    if not fixed.exists():
        raise ValueError(f"not fixed yet: {path}")
    return fixed.read_text()


@app.task(name="retryproj.retry_once_then_until_fixed", base=Hooked, bind=True, max_retries=5)
def retry_once_then_until_fixed(self: Task, path: str) -> str:
    """Asks for one retry (0.1 s) on its first attempt, then behaves as until_fixed."""
    _append(f"{path}.log", f"ran {self.request.retries}")
    if self.request.retries == 0:
        raise self.retry(exc=ConnectionError("first try"), countdown=0.1)
    fixed = Path(f"{path}.fixed")
    if not fixed.exists():
        raise ValueError(f"not fixed yet: {path}")
    return fixed.read_text()


@app.task(name="retryproj.big_retry", bind=True, max_retries=1)
def big_retry(self: Task, value: str, size: int) -> int:
    """Retries once with a ``size``-character argument, then returns its length."""
    if self.request.retries == 0:
        raise self.retry(args=["x" * size, size], countdown=0)
    return len(value)
