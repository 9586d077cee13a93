"""The shop's tasks, as a Django project writes them (``django.tasks``, or the
``django_tasks`` backport before Django 6)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task()
def add(x: int, y: int) -> int:
    return x + y


@task(queue_name="emails")
def send_welcome(address: str) -> dict[str, Any]:
    return {"sent_to": address, "at": time.time()}


@task()
def fail(why: str) -> None:
    raise ValueError(f"cannot: {why}")


@task(takes_context=True)
def attempt_seen(context: Any) -> int:
    return int(context.attempt)


@task()
async def sleepy(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "awake"


@task()
def count_rows() -> int:
    """Reads the project's database from the worker."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return int(cursor.fetchone()[0])
