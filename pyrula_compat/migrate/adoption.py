"""Adopting a Celery broker's messages as durable runs (``pyrula migrate celery``).

Each message becomes the run ``apply_async`` would have made of it: the Celery task id is
the run id and its idempotency key (a message adopted twice is one run), with its args,
kwargs, eta (a countdown arrives as one), expiry, retries so far, time limits, root and
parent ids, group, callbacks, errbacks and the rest of its chain; its queue and priority
are passed on as ``apply_async`` options. A message leaves the broker only once its run
is stored (:mod:`.broker`), so a kill at any point loses nothing and a rerun finishes what
was taken.

Left in place, and reported with their ids: messages that are not JSON (pickle is never
unpickled), that do not decode, that name a task the app does not have, and the header
tasks of a chord (a chord cannot be rebuilt from one of its messages: Celery's workers
finish those). Messages reserved by Celery workers (``unacked``) are adopted only when
asked, and only once they have been reserved longer than the visibility timeout, as
Celery's own restore does.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyrula_compat.migrate.broker import CeleryBroker, Held
from pyrula_compat.migrate.messages import CeleryMessage, Unadoptable, decode

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

PAGE = 200
"""Messages read from a queue list at a time."""


@dataclass(frozen=True)
class Skipped:
    """A message left in the broker, and why."""

    where: str
    task_id: str | None
    task: str | None
    reason: str


@dataclass
class Report:
    dry_run: bool = False
    adopted: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    """(task, queue, priority) → messages adopted (with ``dry_run``: that would be)."""
    already: int = 0
    """Messages whose run was stored already (adopted before): taken off the broker."""
    skipped: list[Skipped] = field(default_factory=list)
    reserved: int = 0
    """Messages reserved by Celery workers and left to them."""

    @property
    def total(self) -> int:
        return sum(self.adopted.values())

    def pickled(self) -> Counter[str]:
        """Task name → pickle-serialized messages left in place."""
        return Counter(
            s.task or "?" for s in self.skipped if s.reason.startswith("pickle-serialized")
        )


class Adoption:
    """One pass over the broker. ``queues``: the queue names to read; ``known``: the task
    names the app has (None: adopt any name); ``include_unacked``: also take reserved
    messages older than ``visibility_timeout`` seconds."""

    def __init__(
        self,
        app: Celery,
        broker: CeleryBroker,
        queues: Iterable[str],
        *,
        known: set[str] | None = None,
        include_unacked: bool = False,
        visibility_timeout: float = 3600.0,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.app = app
        self.broker = broker
        self.queues = sorted(set(queues))
        self.known = known
        self.include_unacked = include_unacked
        self.visibility_timeout = visibility_timeout
        self.report = Report(dry_run=dry_run)
        self.progress = progress
        self._reported: set[str] = set()

    def run(self) -> Report:
        for held in self.broker.adopting():  # taken by an adoption that did not finish
            if self.report.dry_run:
                self._tally(held, decode(held.raw))
            else:
                self._store(held, decode(held.raw))
        for queue in self.queues:
            for key, priority in self.broker.queue_keys(queue):
                self._drain(key, queue, priority)
        self._reserved()
        return self.report

    # -- reading --------------------------------------------------------------------
    def _drain(self, key: str, queue: str, priority: int) -> None:
        """Adopt a queue list's messages, oldest first, until only those left in place
        remain (passes again while Celery's workers shift it under us)."""
        while True:
            took = 0
            skip = 0
            while batch := self.broker.oldest(key, skip, PAGE):
                for raw in batch:
                    held = Held(raw=raw, source=key, queue=queue, priority=priority)
                    message = self._readable(held, f"queue {queue!r}")
                    if message is None or self.report.dry_run:
                        if message is not None:
                            self._tally(held, message)
                        skip += 1
                        continue
                    if self.broker.take(held):  # else a Celery worker took it first
                        self._store(held, message)
                        took += 1
            if self.report.dry_run or took == 0:
                return

    def _reserved(self) -> None:
        now = time.time()
        for tag, taken_at, routing_key, raw in self.broker.unacked():
            if not self.include_unacked or now - taken_at < self.visibility_timeout:
                self.report.reserved += 1
                continue
            queue = routing_key or str(self.app.conf.task_default_queue or "celery")
            held = Held(raw=raw, source="unacked", queue=queue, tag=tag)
            message = self._readable(held, f"unacked {tag}")
            if message is None:
                continue
            held = Held(raw=raw, source="unacked", queue=queue, priority=message.priority or 0,
                        tag=tag)  # fmt: skip
            if self.report.dry_run:
                self._tally(held, message)
            elif self.broker.take(held):
                self._store(held, message)

    def _readable(self, held: Held, where: str) -> CeleryMessage | None:
        try:
            message = decode(held.raw)
            if message.chord is not None:
                raise Unadoptable(
                    "a chord's header task: the chord cannot be rebuilt from one message, "
                    "left for Celery's workers", message.task, message.task_id,
                )  # fmt: skip
            if self.known is not None and message.task not in self.known:
                raise Unadoptable(
                    f"the app has no task named {message.task!r}", message.task, message.task_id
                )
        except Unadoptable as exc:
            if held.raw not in self._reported:
                self._reported.add(held.raw)
                self.report.skipped.append(Skipped(where, exc.task_id, exc.task, exc.reason))
            return None
        return message

    # -- storing --------------------------------------------------------------------
    def _tally(self, held: Held, message: CeleryMessage) -> None:
        self.report.adopted[(message.task, held.queue, message.priority or held.priority)] += 1
        if self.progress is not None:
            self.progress(1)

    def _store(self, held: Held, message: CeleryMessage) -> None:
        """Store the message's run (unless it is stored already), then drop the message."""
        if self.app.client().get_run(message.task_id) is not None:
            self.report.already += 1
        else:
            submit_message(self.app, message, held.queue)
            self._tally(held, message)
        self.broker.done(held)


def submit_message(app: Celery, message: CeleryMessage, queue: str) -> None:
    """The run ``message`` asks for, through the same path as ``apply_async``."""
    from pyrula_compat import calling

    options: dict[str, Any] = {"queue": queue}
    for name in ("eta", "expires", "time_limit", "soft_time_limit", "priority",
                 "ignore_result", "origin", "shadow"):  # fmt: skip
        value = getattr(message, name)
        if value is not None:
            options[name] = value
    extra = {
        "chain": message.chain or None,
        "root_id": message.root_id,
        "parent_id": message.parent_id,
        "group_id": message.group_id,
        "group_index": message.group_index,
        "retries": message.retries or None,
    }
    calling.submit(
        app, message.task, message.args, message.kwargs, task_id=message.task_id,
        link=message.callbacks or None, link_error=message.errbacks or None,
        options=options, extra=extra,
    )  # fmt: skip
