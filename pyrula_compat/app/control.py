"""``app.control``: revoke (durable, even before the task is sent), and the inspect calls
health checks use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyrula.workflows import InvalidRunState, RunNotFound, RunStatus
from pyrula.workflows.errors import IdempotencyConflict
from pyrula_compat import notices
from pyrula_compat.app.inspect import Inspect
from pyrula_compat.runstate import REVOKED_TASK

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery


def purgeable(app: Celery) -> list[str]:
    """The names a purge covers: every task of ``app`` and its canvas runs (not the
    revoke notices it keeps)."""
    return sorted(d.name for d in app.registry.all() if d.name != notices.NOTICE)


class Control:
    """Celery's remote control, on the store: no broadcast, nothing held in memory."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def revoke(
        self,
        task_id: str | Iterable[str],
        destination: Any = None,
        terminate: bool = False,
        signal: Any = None,
        **kwargs: Any,
    ) -> None:
        """Cancel the tasks durably: a queued or waiting one never runs, a running one
        stops at its next step boundary. ``terminate=True`` ends it at once: its result
        is discarded, and its worker raises ``BodyStopped`` in the body's thread once it hears
        of it (lease news: at once). A finished
        id is left as it is. An id no task has yet is remembered, as Celery's workers
        remember revoked ids, but in the store: a revoked run is left under it, so the
        task sent later with that id is discarded (it never runs; it reads REVOKED)."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        client = self.app.client()
        for one in ids:
            self._revoke_one(client, str(one), terminate)

    def _revoke_one(self, client: Any, run_id: str, terminate: bool) -> None:
        handle = client.handle("", run_id)
        for _ in range(3):  # an unknown id: the tombstone, unless the task is sent meanwhile
            try:
                if terminate:
                    before = client.get_run(run_id)
                    record = handle.terminate()
                    if before is not None and before.status is RunStatus.RUNNING:
                        return  # its worker sends task_revoked(terminated=True)
                else:
                    record = handle.cancel()  # still running: its worker notices it
                notices.after_revoke(client, record)  # no worker held it: a notice
                return
            except InvalidRunState:  # already ended
                return
            except RunNotFound:
                pass
            try:
                created = client.submit(REVOKED_TASK, {}, run_id=run_id, idempotency_key=run_id)
            except (InvalidRunState, IdempotencyConflict):
                continue  # the task was sent meanwhile: revoke that run
            with contextlib.suppress(InvalidRunState):  # revoked twice at once
                created.cancel()
            return

    def terminate(self, task_id: str | Iterable[str], signal: Any = None, **kwargs: Any) -> None:
        self.revoke(task_id, terminate=True, signal=signal)

    def purge(self) -> int:
        """Discard every task of the app that waits to start (queued, or held by a
        countdown or eta, never started) and return how many: each is revoked (it reads
        ``REVOKED``; in Celery a purged id reads ``PENDING``). Started tasks are left
        alone. As ``pyrula purge -A proj -f``."""
        return int(self.app.client().purge_queued(purgeable(self.app)))

    discard_all = purge

    def inspect(self, destination: Any = None, timeout: float = 1.0, **kwargs: Any) -> Inspect:
        return Inspect(destination, timeout, app=self.app)

    def ping(self, destination: Any = None, timeout: float = 1.0, **kwargs: Any) -> list[Any]:
        replies = self.inspect(destination, timeout=timeout).ping()
        return [{name: reply} for name, reply in (replies or {}).items()]

    def rate_limit(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("rate limits are set on the task (rate_limit=) in pyrula")

    def broadcast(
        self,
        command: str,
        arguments: dict[str, Any] | None = None,
        destination: Any = None,
        reply: bool = False,
        timeout: float = 1.0,
        **kwargs: Any,
    ) -> list[Any] | None:
        """Celery's broadcast of a control command, for the commands pyrula has:
        ``ping``, ``revoke`` and ``terminate`` (with Celery's arguments)."""
        arguments = dict(arguments or {})
        if command == "ping":
            replies = self.ping(timeout=timeout)
            return replies if reply else None
        if command in ("revoke", "terminate"):
            task_id = arguments.pop("task_id")
            terminate = command == "terminate" or bool(arguments.pop("terminate", False))
            self.revoke(task_id, terminate=terminate, signal=arguments.get("signal"))
            return [] if reply else None
        raise NotImplementedError(
            f"control command {command!r}: pyrula workers take no broadcast commands (there "
            "is no broker); ping, revoke and terminate work through the store"
        )
