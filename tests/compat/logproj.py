"""A Celery-shaped app for the worker log tests: a task that succeeds, one that retries
once, one that fails, one that logs with its task logger and prints.

The store comes from ``CELERY_BROKER_URL``; ``LOGPROJ_FORMAT`` / ``LOGPROJ_TASK_FORMAT``
set ``worker_log_format`` / ``worker_task_log_format``.
"""

import os

from pyrula_compat import Celery
from pyrula_compat.utils.log import get_task_logger

app = Celery("logproj", broker=os.environ.get("CELERY_BROKER_URL", "memory://"))
if os.environ.get("LOGPROJ_FORMAT"):
    app.conf.worker_log_format = os.environ["LOGPROJ_FORMAT"]
if os.environ.get("LOGPROJ_TASK_FORMAT"):
    app.conf.worker_task_log_format = os.environ["LOGPROJ_TASK_FORMAT"]

logger = get_task_logger(__name__)


@app.task(name="logproj.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="logproj.flaky", bind=True, max_retries=3)
def flaky(self, value: str) -> str:  # type: ignore[no-untyped-def]
    if self.request.retries == 0:
        raise self.retry(exc=ConnectionError("down"), countdown=0.1)
    return value


@app.task(name="logproj.divide")
def divide(x: int, y: int) -> float:
    return x / y


@app.task(name="logproj.chatty")
def chatty(word: str) -> str:
    logger.info("saying %s", word)
    print(f"printed {word}")
    return word
