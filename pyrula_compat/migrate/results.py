"""Results kept by the old Celery deployment, read while callers still hold its task ids.

With ``result_backend_fallback`` set to the old Redis result backend's URL, an
``AsyncResult`` whose id pyrula has no run for reads Celery's ``celery-task-meta-<id>``
key there (JSON only: a value that is not JSON is left alone and the id reads PENDING),
and sees the task as Celery left it: ``SUCCESS`` with its result, ``FAILURE`` with its
exception (rebuilt only from an exception class that imports and subclasses
BaseException, as pyrula rebuilds its own; otherwise a plain Exception with the message)
and traceback, ``REVOKED``. A task Celery had not finished (``PENDING``, ``STARTED``,
``RETRY``) reads as pyrula's unknown id does, ``PENDING``. The old backend is only read.

``result_backend_fallback_prefix`` is the backend's ``global_keyprefix``, if it had one.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyrula.workflows.records import RunRecord, RunStatus
from pyrula.workflows.serialization import ErrorInfo
from pyrula_compat import codec

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

META_PREFIX = "celery-task-meta-"
ENDED = {
    "SUCCESS": RunStatus.COMPLETED,
    "FAILURE": RunStatus.FAILED,
    "REVOKED": RunStatus.CANCELLED,
}

_clients: dict[str, Any] = {}
_lock = threading.Lock()


def _client(url: str) -> Any:
    with _lock:
        client = _clients.get(url)
        if client is None:
            import valkey

            client = _clients[url] = valkey.Valkey.from_url(url)
        return client


def legacy_record(app: Celery, task_id: str) -> RunRecord | None:
    """The old backend's ended task ``task_id`` as a read-only run record, or None (no
    fallback configured, no such key, not JSON, or not ended there)."""
    url = app.conf.get("result_backend_fallback")
    if not url:
        return None
    prefix = str(app.conf.get("result_backend_fallback_prefix") or "")
    raw = _client(str(url)).get(f"{prefix}{META_PREFIX}{task_id}")
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return record_from_meta(task_id, meta) if isinstance(meta, dict) else None


def record_from_meta(task_id: str, meta: dict[str, Any]) -> RunRecord | None:
    status = ENDED.get(str(meta.get("status")))
    if status is None:
        return None
    done = _epoch(meta.get("date_done"))
    result = error = None
    if status is RunStatus.COMPLETED:
        result = json.dumps(codec.to_json(meta.get("result")))
    elif status is RunStatus.FAILED:
        error = _error(meta.get("result"), str(meta.get("traceback") or "")).to_json()
    return RunRecord(
        run_id=task_id, workflow=str(meta.get("name") or ""), params="{}", status=status,
        owner="", idempotency_key=None, created_at=done, available_at=done, updated_at=done,
        started_at=done, finished_at=done, result=result, error=error,
    )  # fmt: skip


def _epoch(value: Any) -> float:
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return 0.0
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    return 0.0


def _error(value: Any, traceback: str) -> ErrorInfo:
    """Celery's stored exception (``exc_type``, ``exc_module``, ``exc_message``)."""
    if not isinstance(value, dict) or "exc_type" not in value:
        return ErrorInfo("builtins", "Exception", str(value), traceback, (str(value),))
    message = value.get("exc_message")
    args = tuple(message) if isinstance(message, (list, tuple)) else (message,)
    text = str(args[0]) if len(args) == 1 else str(args)
    module = str(value.get("exc_module") or "builtins")
    return ErrorInfo(module, str(value["exc_type"]), text, traceback, args)
