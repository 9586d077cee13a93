"""One message of Celery's Redis transport, decoded without running anything it names.

kombu stores a message as a JSON envelope: ``headers`` (Celery's task protocol 2 puts the
task's name, id, eta, expiry, retries, root and parent ids there), ``properties``
(``priority``, ``delivery_info`` with the routing key, ``body_encoding``) and ``body``
(base64 of the serialized ``[args, kwargs, embed]``; ``embed`` holds the callbacks,
errbacks, the rest of a chain and a chord's body). Only JSON bodies are read: a
pickle-serialized one (``application/x-python-serialize``) is never unpickled, it is
refused with :class:`Unadoptable` naming its task (the task's name is in the JSON
headers, so it can be reported without touching the body). Protocol 1 (every field in
the body) is read too.
"""

from __future__ import annotations

import base64
import binascii
import bz2
import json
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PICKLE = "application/x-python-serialize"
JSON_TYPES = ("application/json", "application/x-json")
DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "application/x-gzip": zlib.decompress,
    "zlib": zlib.decompress,
    "application/x-bz2": bz2.decompress,
    "bzip2": bz2.decompress,
    "application/x-lzma": lzma.decompress,
    "lzma": lzma.decompress,
}
"""kombu's compression content types that the standard library can undo."""


class Unadoptable(Exception):
    """A message pyrula cannot turn into a run; it stays in the broker. ``reason`` says
    why, ``task`` and ``task_id`` are what could be read of it (None when unreadable)."""

    def __init__(self, reason: str, task: str | None = None, task_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.task = task
        self.task_id = task_id


@dataclass(frozen=True)
class CeleryMessage:
    """What a task message asks for, in the shim's terms."""

    task: str
    task_id: str
    args: list[Any]
    kwargs: dict[str, Any]
    eta: str | None = None
    """ISO 8601, as Celery sends it (a countdown arrives as its eta)."""
    expires: str | None = None
    retries: int = 0
    priority: int | None = None
    routing_key: str | None = None
    root_id: str | None = None
    parent_id: str | None = None
    group_id: str | None = None
    group_index: int | None = None
    callbacks: list[dict[str, Any]] = field(default_factory=list)
    errbacks: list[dict[str, Any]] = field(default_factory=list)
    chain: list[dict[str, Any]] = field(default_factory=list)
    """What follows this task, in the order it runs (Celery sends it reversed)."""
    chord: dict[str, Any] | None = None
    time_limit: float | None = None
    soft_time_limit: float | None = None
    ignore_result: bool | None = None
    shadow: str | None = None
    origin: str | None = None


def decode(raw: str | bytes) -> CeleryMessage:
    """The task message stored as ``raw`` (one list item of a queue, or the message part
    of an ``unacked`` entry). Raises :class:`Unadoptable` for anything else."""
    try:
        envelope = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Unadoptable("not a kombu message (the envelope is not JSON)") from None
    if not isinstance(envelope, dict):
        raise Unadoptable("not a kombu message (the envelope is not a JSON object)")
    return from_envelope(envelope)


def from_envelope(envelope: dict[str, Any]) -> CeleryMessage:
    headers = envelope.get("headers") or {}
    properties = envelope.get("properties") or {}
    if not isinstance(headers, dict) or not isinstance(properties, dict):
        raise Unadoptable("not a kombu message (headers or properties are not objects)")
    name, task_id = _text(headers.get("task")), _text(headers.get("id"))
    content_type = str(envelope.get("content-type") or "")
    if content_type == PICKLE:
        raise Unadoptable("pickle-serialized: never unpickled", name, task_id)
    if content_type not in JSON_TYPES:
        raise Unadoptable(f"serialized as {content_type or 'nothing'}: only JSON is adopted",
                          name, task_id)  # fmt: skip
    body = _body(envelope, properties, headers, name, task_id)
    delivery = properties.get("delivery_info") or {}
    priority = properties.get("priority")
    common = {
        "priority": priority if isinstance(priority, int) and not isinstance(priority, bool)
        else None,
        "routing_key": _text(delivery.get("routing_key")) if isinstance(delivery, dict) else None,
    }  # fmt: skip
    if "task" in headers:  # protocol 2: the task's fields are headers
        return _protocol2(headers, body, common)
    if isinstance(body, dict) and "task" in body and "id" in body:
        return _protocol1(body, common)
    raise Unadoptable("not a Celery task message (no task name and id)", name, task_id)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _body(
    envelope: dict[str, Any],
    properties: dict[str, Any],
    headers: dict[str, Any],
    name: str | None,
    task_id: str | None,
) -> Any:
    data = envelope.get("body")
    if not isinstance(data, str):
        raise Unadoptable("the body is not a string", name, task_id)
    raw: bytes
    if properties.get("body_encoding") == "base64":
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise Unadoptable("the body is not valid base64", name, task_id) from None
    else:
        raw = data.encode(str(envelope.get("content-encoding") or "utf-8"))
    compression = headers.get("compression")
    if compression:
        undo = DECOMPRESS.get(str(compression))
        if undo is None:
            raise Unadoptable(f"compressed with {compression}: not readable here", name, task_id)
        try:
            raw = undo(raw)
        except (OSError, ValueError, zlib.error, lzma.LZMAError):
            raise Unadoptable(
                f"the body does not decompress ({compression})", name, task_id
            ) from None
    try:
        return json.loads(raw.decode(str(envelope.get("content-encoding") or "utf-8")))
    except (ValueError, UnicodeDecodeError, LookupError):
        raise Unadoptable("the body does not decode as JSON", name, task_id) from None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _limits(value: Any) -> tuple[float | None, float | None]:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _number(value[0]), _number(value[1])
    return None, None


def _signatures(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    return [item for item in items if isinstance(item, dict) and item.get("task")]


def _protocol2(headers: dict[str, Any], body: Any, common: dict[str, Any]) -> CeleryMessage:
    name, task_id = _text(headers.get("task")), _text(headers.get("id"))
    if name is None or task_id is None:
        raise Unadoptable("the headers name no task or no id", name, task_id)
    if not (isinstance(body, list) and len(body) == 3):
        raise Unadoptable("the body is not [args, kwargs, embed]", name, task_id)
    args, kwargs, embed = body
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise Unadoptable("args is not a list or kwargs not an object", name, task_id)
    embed = embed if isinstance(embed, dict) else {}
    hard, soft = _limits(headers.get("timelimit"))
    retries = headers.get("retries")
    index = headers.get("group_index")
    ignore = headers.get("ignore_result")
    return CeleryMessage(
        task=name, task_id=task_id, args=args, kwargs=kwargs,
        eta=_text(headers.get("eta")), expires=_text(headers.get("expires")),
        retries=retries if isinstance(retries, int) and retries > 0 else 0,
        root_id=_text(headers.get("root_id")), parent_id=_text(headers.get("parent_id")),
        group_id=_text(headers.get("group")),
        group_index=index if isinstance(index, int) and not isinstance(index, bool) else None,
        callbacks=_signatures(embed.get("callbacks")), errbacks=_signatures(embed.get("errbacks")),
        chain=list(reversed(_signatures(embed.get("chain")))),
        chord=embed.get("chord") if isinstance(embed.get("chord"), dict) else None,
        time_limit=hard, soft_time_limit=soft,
        ignore_result=ignore if isinstance(ignore, bool) else None,
        shadow=_text(headers.get("shadow")), origin=_text(headers.get("origin")),
        **common,
    )  # fmt: skip


def _protocol1(body: dict[str, Any], common: dict[str, Any]) -> CeleryMessage:
    name, task_id = _text(body.get("task")), _text(body.get("id"))
    if name is None or task_id is None:
        raise Unadoptable("the body names no task or no id", name, task_id)
    args, kwargs = body.get("args") or [], body.get("kwargs") or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise Unadoptable("args is not a list or kwargs not an object", name, task_id)
    hard, soft = _limits(body.get("timelimit"))
    retries = body.get("retries")
    return CeleryMessage(
        task=name, task_id=task_id, args=args, kwargs=kwargs,
        eta=_text(body.get("eta")), expires=_text(body.get("expires")),
        retries=retries if isinstance(retries, int) and retries > 0 else 0,
        group_id=_text(body.get("taskset")),
        callbacks=_signatures(body.get("callbacks")), errbacks=_signatures(body.get("errbacks")),
        chord=body.get("chord") if isinstance(body.get("chord"), dict) else None,
        time_limit=hard, soft_time_limit=soft, **common,
    )  # fmt: skip
