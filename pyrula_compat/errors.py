"""Exceptions in stored form and back: the task's own class, or a stand-in of the same name.

A task that fails is recorded by the engine with its exception's module, qualified
name, message and traceback text. Reading it back gives an instance of the original
class when it imports (only attribute lookups: nothing named in stored data is called),
else an instance of a stand-in class carrying the same module and name, so the type
still reads right in logs and in a re-raise.
"""

from __future__ import annotations

import ast
import contextlib
import threading
import traceback
from typing import Any

from pyrula.workflows.serialization import ErrorInfo, StoredTraceback

_stand_ins: dict[tuple[str, str], type[Exception]] = {}
_lock = threading.Lock()


class RemoteTraceback(StoredTraceback):
    """Carries the traceback text of the attempt that failed (as ``__cause__``); the
    engine records that text, not the re-raise's, as Celery gives a failed chain's later
    tasks the failed task's traceback."""

    def __str__(self) -> str:
        return str(self.args[0]).rstrip("\n") if self.args else ""


def _stand_in(module: str, qualname: str) -> type[Exception]:
    with _lock:
        cls = _stand_ins.get((module, qualname))
        if cls is None:
            name = qualname.rsplit(".", 1)[-1]
            cls = type(name, (Exception,), {"__module__": module, "__qualname__": qualname})
            _stand_ins[(module, qualname)] = cls
        return cls


def rebuild(info: ErrorInfo) -> BaseException:
    """An exception of the recorded class (or a stand-in) with the recorded message:
    ``cls(*args)`` as Celery rebuilds it when the class imports and its args were stored
    (the engine's :meth:`ErrorInfo.rebuild`)."""
    klass: type[BaseException] | None = info.exception_class()
    if klass is not None and info.args is not None:
        return info.rebuild()
    if klass is None:
        klass = _stand_in(info.type_module, info.type_name)
    message: Any = info.message
    if issubclass(klass, KeyError):
        # str(KeyError(k)) is repr(k): read it back, or every round trip adds quotes.
        with contextlib.suppress(ValueError, SyntaxError):
            message = ast.literal_eval(info.message)
    try:
        exc = klass.__new__(klass)
        exc.args = (message,)
    except Exception:
        stand_in = _stand_in(info.type_module, info.type_name)
        exc = stand_in(info.message)
    return exc


def to_json(exc: BaseException) -> str:
    """``exc`` in the engine's stored error form."""
    return ErrorInfo.from_exception(exc).to_json()


def from_json(text: str) -> tuple[BaseException, str]:
    """The rebuilt exception and its traceback text."""
    info = ErrorInfo.from_json(text)
    return rebuild(info), info.traceback


def with_remote_traceback(exc: BaseException, tb_text: str) -> BaseException:
    """``exc`` chained to its original traceback text, so a re-record keeps it."""
    if tb_text:
        exc.__cause__ = RemoteTraceback(tb_text)
    return exc


def format_exc(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class ExceptionInfo:
    """What Celery's hooks receive as ``einfo``: the exception and its traceback text."""

    def __init__(self, exc: BaseException, tb_text: str | None = None) -> None:
        self.exception = exc
        self.type = type(exc)
        self.tb = exc.__traceback__
        self.traceback = tb_text if tb_text is not None else format_exc(exc)
        self.internal = False

    def __str__(self) -> str:
        return self.traceback

    def __repr__(self) -> str:
        return f"<ExceptionInfo: {self.exception!r}>"

    @property
    def exc_info(self) -> tuple[type[BaseException], BaseException, Any]:
        return self.type, self.exception, self.tb
