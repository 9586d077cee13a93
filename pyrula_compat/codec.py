"""Task arguments and results as JSON, with kombu's type tags.

Celery's JSON serializer round-trips ``datetime``, ``date``, ``time``, ``UUID``,
``Decimal`` and ``bytes`` as ``{"__type__": ..., "__value__": ...}``, and turns tuples
into lists. This does the same, so task code that passes a datetime keeps receiving a
datetime. Anything else that is not JSON fails at the call site, as kombu's
``EncodeError`` does (here: pyrula's ``NotJSONSerializable``, a ``TypeError``).
"""

from __future__ import annotations

import base64
import uuid
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

_TYPE = "__type__"
_VALUE = "__value__"


def _tag(value: Any) -> Any:
    if isinstance(value, datetime):
        return {_TYPE: "datetime", _VALUE: value.isoformat()}
    if isinstance(value, date):
        return {_TYPE: "date", _VALUE: value.isoformat()}
    if isinstance(value, time):
        return {_TYPE: "time", _VALUE: value.isoformat()}
    if isinstance(value, uuid.UUID):
        return {_TYPE: "uuid", _VALUE: str(value)}
    if isinstance(value, Decimal):
        return {_TYPE: "decimal", _VALUE: str(value)}
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {_TYPE: "bytes", _VALUE: base64.b64encode(bytes(value)).decode("ascii")}
    return value  # not ours: the store's encoder names it if it is not JSON


def to_json(value: Any) -> Any:
    """A JSON-ready copy of ``value``: tuples become lists, tagged types become tags."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {key: to_json(item) for key, item in value.items()}
    return _tag(value)


def _untag(kind: str, text: Any) -> Any:
    if kind == "datetime":
        return datetime.fromisoformat(text)
    if kind == "date":
        return date.fromisoformat(text)
    if kind == "time":
        return time.fromisoformat(text)
    if kind == "uuid":
        return uuid.UUID(text)
    if kind == "decimal":
        return Decimal(text)
    if kind == "bytes":
        return base64.b64decode(text)
    return {_TYPE: kind, _VALUE: text}


def from_json(value: Any) -> Any:
    """Undo :func:`to_json` (lists stay lists, as after Celery's JSON round trip)."""
    if isinstance(value, list):
        return [from_json(item) for item in value]
    if isinstance(value, dict):
        if len(value) == 2 and _TYPE in value and _VALUE in value:
            return _untag(str(value[_TYPE]), value[_VALUE])
        return {key: from_json(item) for key, item in value.items()}
    return value
