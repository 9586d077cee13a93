"""Run by the tests in a process of its own: the Django side of a project using
``django.tasks`` on pyrula. Enqueues, waits and prints one JSON object of what it saw.
Argument: the scenario name."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import timedelta
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.compat.djtasks.settings")
django.setup()

from django.utils import timezone  # noqa: E402

from pyrula_compat.django.framework import InvalidTask, TaskResultStatus  # noqa: E402
from tests.compat.djtasks.shop import tasks  # noqa: E402


def wait(result: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not result.is_finished:
        if time.monotonic() > deadline:
            raise SystemExit(f"task {result.id} did not finish: {result.status}")
        time.sleep(0.05)
        result.refresh()
    return result


def main(name: str) -> dict[str, Any]:
    if name == "basics":
        added = tasks.add.enqueue(2, 3)
        ready = str(added.status)
        wait(added)
        again = tasks.add.get_result(added.id)
        email = wait(tasks.send_welcome.enqueue("a@example.com"))
        failed = wait(tasks.fail.enqueue("no stock"))
        ctx = wait(tasks.attempt_seen.enqueue())
        sleepy = wait(tasks.sleepy.enqueue(0.1))
        rows = wait(tasks.count_rows.enqueue())
        return {
            "first_status": ready, "status": str(again.status), "value": again.return_value,
            "args": again.args, "enqueued": again.enqueued_at is not None,
            "finished": again.finished_at is not None, "attempts": again.attempts,
            "email": email.return_value["sent_to"], "email_queue": email.task.queue_name,
            "failed_status": str(failed.status),
            "error_class": failed.errors[0].exception_class_path,
            "error_tb": failed.errors[0].traceback, "context_attempt": ctx.return_value,
            "async": sleepy.return_value, "rows": rows.return_value,
            "failed_is_error": failed.status == TaskResultStatus.FAILED,
        }  # fmt: skip
    if name == "defer":
        when = timezone.now() + timedelta(seconds=2)
        result = tasks.send_welcome.using(run_after=when).enqueue("later@example.com")
        wait(result)
        return {"late_by": result.return_value["at"] - when.timestamp(),
                "started_after": result.started_at >= when}  # fmt: skip
    if name == "async_api":

        async def run() -> dict[str, Any]:
            result = await tasks.add.aenqueue(20, 22)
            while not result.is_finished:
                await asyncio.sleep(0.05)
                await result.arefresh()
            got = await tasks.add.aget_result(result.id)
            return {"value": got.return_value}

        return asyncio.run(run())
    if name == "refused":
        out: dict[str, Any] = {}
        for label, make in (
            ("priority", lambda: tasks.add.using(priority=10)),
            ("queue", lambda: tasks.add.using(queue_name="nope")),
        ):
            try:
                make()
                out[label] = "accepted"
            except InvalidTask as exc:
                out[label] = str(exc)
        return out
    raise SystemExit(f"unknown scenario {name}")


print(json.dumps(main(sys.argv[1])))
