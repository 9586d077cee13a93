"""JSON codec for everything pyrula stores or sends, and the stored form of errors.

Rules: payloads are plain JSON (``dict`` with ``str`` keys, ``list``/``tuple``, ``str``,
``int``, ``float`` that is finite, ``bool``, ``None``). Nothing is ever pickled. An error
travels as its class's module and qualified name, its message, its ``args`` when they are
plain JSON (and small: see :data:`MAX_ERROR_ARGS_BYTES`) and its traceback text; it is
rebuilt only as an exception class that imports and subclasses ``BaseException``,
never by calling anything else named in stored data.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.errors import NotJSONSerializable, PayloadTooLarge

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
"""Default maximum size of one encoded payload (params, a step result, a run result)."""


_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
_CANONICAL = json.JSONEncoder(
    separators=(",", ":"), allow_nan=False, ensure_ascii=False, sort_keys=True
)
"""``json.dumps`` with these options builds an encoder on every call; these are built
once (an encoder keeps no state between calls, so threads may share them)."""


def _check(value: Any, path: str) -> None:
    """Walk ``value`` and raise NotJSONSerializable naming the first bad path."""
    if value is None or isinstance(value, (bool, str)):
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSONSerializable(f"{path} is {value!r}: NaN and infinities are not JSON", path)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJSONSerializable(
                    f"{path} has a key {key!r} of type {type(key).__name__}: "
                    "JSON object keys must be str",
                    path,
                )
            _check(item, f"{path}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check(item, f"{path}[{index}]")
        return
    raise NotJSONSerializable(
        f"{path} is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON; "
        "pass plain dicts, lists, str, int, finite float, bool or None",
        path,
    )


def _keys_are_str(value: Any) -> bool:
    """Whether every dict inside ``value`` has only str keys."""
    if isinstance(value, dict):
        return all(isinstance(key, str) for key in value) and all(
            _keys_are_str(item) for item in value.values() if isinstance(item, (dict, list, tuple))
        )
    if isinstance(value, (list, tuple)):
        return all(_keys_are_str(item) for item in value if isinstance(item, (dict, list, tuple)))
    return True


def encode(
    value: Any,
    *,
    what: str = "value",
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    canonical: bool = False,
) -> str:
    """Encode ``value`` as compact JSON, or raise naming the offending path.

    ``what`` is the name used in messages (``params``, ``result of step 'charge'``).
    ``canonical`` sorts object keys, so equal values always encode to equal text (params
    are encoded so, which makes idempotency checks independent of key order).
    """
    try:
        text = (_CANONICAL if canonical else _COMPACT).encode(value)
    except (TypeError, ValueError):
        _check(value, what)
        raise  # pragma: no cover - _check always raises for what json rejects
    if not _keys_are_str(value):
        # json.dumps silently turns int, float, bool and None keys into strings, so the
        # value would come back changed: refuse it like any other non-JSON value.
        _check(value, what)
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise NotJSONSerializable(
                f"{what} holds a string with a lone surrogate "
                f"({exc.object[exc.start : exc.end]!r}), which is not valid UTF-8 text; "
                "decode bytes with errors='replace' or pass them base64-encoded",
                what,
            ) from None
    if size > max_bytes:
        raise PayloadTooLarge(
            f"{what} encodes to {size} bytes, over the maximum of "
            f"{max_bytes} bytes; store large data elsewhere and pass a reference"
        )
    return text


def decode(text: str) -> Any:
    """Decode JSON written by :func:`encode`."""
    return json.loads(text)


MAX_ERROR_ARGS_BYTES = 8 * 1024
"""Largest ``args`` an :class:`ErrorInfo` keeps, in bytes of UTF-8 JSON. Args that encode
to more, or are not plain JSON, are not stored: the error is then rebuilt from its message
(the message and the traceback are always stored)."""


def _call_args(exc: BaseException) -> Any:
    """The arguments that make ``exc`` again: its ``args``, except that an OSError keeps
    its ``filename`` (and ``filename2``) out of ``args``, so those are added back."""
    args = exc.args
    if isinstance(exc, OSError) and len(args) == 2:
        if exc.filename2 is not None:
            return (*args, exc.filename, None, exc.filename2)  # None: winerror
        if exc.filename is not None:
            return (*args, exc.filename)
    return args


def _stored_args(exc: BaseException) -> tuple[Any, ...] | None:
    """``exc``'s arguments as they will read back from the store, or None if they can't be
    kept."""
    try:
        args = _call_args(exc)
        if not isinstance(args, tuple):
            return None
        text = encode(list(args), what="exception args", max_bytes=MAX_ERROR_ARGS_BYTES)
    except Exception:  # not JSON, too large, circular, too deep, an int over 4300 digits
        return None
    stored: list[Any] = decode(text)  # tuples inside read back as lists, as in the store
    return tuple(stored)


def _text(exc: BaseException) -> str | None:
    """``str(exc)``, or None if the class's ``__str__`` raises."""
    try:
        return str(exc)
    except Exception:
        return None


class StoredTraceback(Exception):
    """The cause of an exception raised again from a stored failure: its one argument is
    the traceback text of the attempt that failed. :meth:`ErrorInfo.from_exception`
    records that text instead of the re-raise's own traceback, so a failure passed
    along (a chain's later task, a parent re-raising a child's error) keeps the
    traceback of where it happened."""


@dataclass(frozen=True)
class ErrorInfo:
    """An exception in stored form: class location, message, traceback text and, when
    they are plain JSON and at most :data:`MAX_ERROR_ARGS_BYTES`, its ``args``.

    ``args`` is None for a record written before args were stored, or when they could not
    be kept; such a record rebuilds from its message alone.
    """

    type_module: str
    type_name: str
    message: str
    traceback: str
    args: tuple[Any, ...] | None = field(default=None, hash=False)

    @property
    def qualified_type(self) -> str:
        return f"{self.type_module}.{self.type_name}"

    @classmethod
    def from_exception(cls, exc: BaseException) -> ErrorInfo:
        cause = exc.__cause__
        if isinstance(cause, StoredTraceback) and cause.args:
            tb = str(cause.args[0])  # the failure's own traceback (see StoredTraceback)
        else:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(
            type_module=type(exc).__module__,
            type_name=type(exc).__qualname__,
            message=str(exc),
            traceback=tb,
            args=_stored_args(exc),
        )

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "module": self.type_module,
            "type": self.type_name,
            "message": self.message,
            "traceback": self.traceback,
        }
        if self.args is not None:
            data["args"] = list(self.args)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ErrorInfo:
        """The error stored as ``text``; ValueError if it is not an error's JSON object."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a stored error is not a JSON object: {text[:80]!r}")
        args = data.get("args")
        return cls(
            type_module=str(data.get("module", "builtins")),
            type_name=str(data.get("type", "Exception")),
            message=str(data.get("message", "")),
            traceback=str(data.get("traceback", "")),
            args=tuple(args) if isinstance(args, list) else None,
        )

    def exception_class(self) -> type[BaseException] | None:
        """The exception class named here, if it subclasses BaseException and its module
        is imported already, or belongs to a package that is (``myapp.errors`` once
        ``myapp`` is imported: a process that runs or submits a task has imported its
        package).

        Stored data can be written by whoever can write the store, so nothing it names
        is called, and it can make this process import no package it has not imported
        itself (importing runs a module's code; CVE-2021-23727 was Celery's variant).
        Only attribute lookups are made on the module.
        """
        name = self.type_module
        module = sys.modules.get(name)
        if module is None:
            if name.partition(".")[0] not in sys.modules:
                return None
            try:
                module = importlib.import_module(name)
            except Exception:
                return None
        obj: Any = module
        for part in self.type_name.split("."):
            if part == "<locals>":
                return None
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        if isinstance(obj, type) and issubclass(obj, BaseException):
            return obj
        return None

    def rebuild(self) -> BaseException:
        """An instance of the original class, or a RuntimeError if it can't be had.

        Only a class :meth:`exception_class` accepts is used. With stored ``args`` it is
        called as ``cls(*args)`` (as Celery does), so ``__init__`` sets its attributes
        again; that result is kept if it is an instance of the class and its ``str`` is
        the stored message. Otherwise (no stored args, ``__init__`` raised, or the message
        came out different) the instance is made with ``cls.__new__`` and no ``__init__``
        runs: it gets the stored args if they give back the message, else the message.
        """
        klass = self.exception_class()
        if klass is None:
            return RuntimeError(f"{self.qualified_type}: {self.message}")
        if self.args is not None:
            try:
                called = klass(*self.args)
            except Exception:
                called = None
            if isinstance(called, klass) and _text(called) == self.message:
                return called
        try:
            exc = klass.__new__(klass)
            if self.args is not None:
                exc.args = self.args
                if _text(exc) == self.message:
                    return exc
            exc.args = (self.message,)
        except Exception:
            return RuntimeError(f"{self.qualified_type}: {self.message}")
        return exc
