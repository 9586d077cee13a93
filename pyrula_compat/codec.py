"""Task arguments and results as JSON, with kombu's type tags.

Celery's JSON serializer round-trips ``datetime``, ``date``, ``time``, ``UUID``,
``Decimal`` and ``bytes`` as ``{"__type__": ..., "__value__": ...}``, turns tuples
into lists, and turns ``int``, ``float``, ``bool`` and ``None`` dict keys into strings as
``json.dumps`` does (``{1: "a"}`` arrives as ``{"1": "a"}``). This does the same, so task
code that passes a datetime keeps receiving a datetime. Anything else that is not JSON
(a set, an object, a tuple as a dict key) fails at the call site, as kombu's
``EncodeError`` does (here: pyrula's ``NotJSONSerializable``, a ``TypeError``). Only task
arguments, results and headers go through here: a plain pyrula workflow's params keep the
engine's rule that dict keys are ``str``.
"""

from __future__ import annotations

import base64
import math
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


def _key(key: Any) -> Any:
    """A dict key as ``json.dumps`` writes it: ``True`` -> ``"true"``, ``None`` ->
    ``"null"``, ``1.5`` -> ``"1.5"``, ``nan`` -> ``"NaN"``. A key of another type is kept,
    for the store's encoder to refuse by name."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        if key != key:
            return "NaN"
        if key in (math.inf, -math.inf):
            return "Infinity" if key > 0 else "-Infinity"
        return float.__repr__(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    return key


def to_json(value: Any) -> Any:
    """A JSON-ready copy of ``value``: tuples become lists, tagged types become tags, and
    int/float/bool/None dict keys become strings (a later key that reads the same wins,
    as after ``json.loads``)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, dict):
        return {
            (key if type(key) is str else _key(key)): to_json(item) for key, item in value.items()
        }
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
