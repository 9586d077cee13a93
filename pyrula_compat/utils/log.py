"""``celery.utils.log``: task loggers are children of ``celery.task``, as in Celery; the
formatter, the stdout proxy and the level parser ``app.log`` uses."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

task_logger = logging.getLogger("celery.task")
worker_logger = logging.getLogger("celery.worker")
base_logger = logging.getLogger("celery")

LOG_LEVELS: dict[str, int] = {
    "NOTSET": logging.NOTSET, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
    "WARN": logging.WARNING, "WARNING": logging.WARNING, "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL, "CRITICAL": logging.CRITICAL,
}  # fmt: skip
"""Level names (upper case) to levels, as Celery's (kombu's) ``LOG_LEVELS``."""


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``."""
    return logging.getLogger(name)


def get_task_logger(name: str) -> logging.Logger:
    """A logger for task modules: ``celery.task.<name>`` propagates to ``celery.task``."""
    if name in {"celery.task", "celery"}:
        raise RuntimeError(f"logger name {name!r} is reserved")
    return _child(name)


def _child(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    # Celery re-parents task loggers under celery.task so its handlers apply.
    logger.parent = task_logger
    return logger


_in_sighandler = False


def set_in_sighandler(value: bool) -> None:
    """Say whether this process is inside a signal handler (logging is not safe there:
    a :class:`LoggingProxy` then writes straight to ``sys.__stderr__``)."""
    global _in_sighandler
    _in_sighandler = value


@contextmanager
def in_sighandler() -> Iterator[None]:
    """:func:`set_in_sighandler` for the block."""
    set_in_sighandler(True)
    try:
        yield
    finally:
        set_in_sighandler(False)


def get_multiprocessing_logger() -> logging.Logger | None:
    """Celery's is billiard's logger; pyrula has no billiard pool: None, as Celery
    returns without billiard."""
    return None


def reset_multiprocessing_logger() -> None:
    """Nothing to reset without billiard (as in Celery without it)."""


def mlevel(level: Any) -> Any:
    """A level name (any case) as its number; a number (or nothing) as it is."""
    if level and not isinstance(level, int):
        try:
            return LOG_LEVELS[str(level).upper()]
        except KeyError:
            raise ValueError(
                f"unknown log level {level!r}: use one of {', '.join(LOG_LEVELS)}"
            ) from None
    return level


class ColorFormatter(logging.Formatter):
    """A formatter that colors a record by its level when ``use_color``."""

    colors: dict[str, str] = {
        "DEBUG": "\033[34m", "WARNING": "\033[33m", "ERROR": "\033[31m",
        "CRITICAL": "\033[35m",
    }  # fmt: skip

    def __init__(
        self, fmt: str | None = None, use_color: bool = True, datefmt: str | None = None
    ) -> None:
        super().__init__(fmt, datefmt)
        self.use_color = use_color

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        color = self.colors.get(record.levelname)
        return f"{color}{text}\033[0m" if color and self.use_color else text


class LoggingProxy:
    """A file-like object that sends what is written to it to ``logger``, a line a
    record at ``loglevel`` (``print()`` in a task, once stdout is redirected)."""

    mode = "w"
    name: str | None = None
    closed = False
    loglevel = logging.ERROR
    _thread = threading.local()

    def __init__(self, logger: logging.Logger, loglevel: Any = None) -> None:
        self.logger = logger
        self.loglevel = mlevel(loglevel or self.logger.level or self.loglevel)

    def write(self, data: str) -> int:
        if _in_sighandler:
            print(data, file=sys.__stderr__)
            return len(data)
        if getattr(self._thread, "recurse_protection", False):
            return 0  # the logger writes back to this proxy: stop there
        if data and not self.closed:
            self._thread.recurse_protection = True
            try:
                text = str(data).rstrip("\n")
                if text:
                    self.logger.log(self.loglevel, text)
                    return len(text)
            finally:
                self._thread.recurse_protection = False
        return 0

    def writelines(self, sequence: Iterable[str]) -> None:
        for part in sequence:
            self.write(part)

    def flush(self) -> None:
        pass  # unbuffered

    def close(self) -> None:
        self.closed = True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        # What a subprocess or faulthandler inherits: the real stderr.
        stream = sys.__stderr__
        if stream is None:
            raise OSError("no stderr to hand on")
        return stream.fileno()


__all__ = [
    "LOG_LEVELS",
    "ColorFormatter",
    "LoggingProxy",
    "base_logger",
    "get_logger",
    "get_multiprocessing_logger",
    "get_task_logger",
    "in_sighandler",
    "mlevel",
    "reset_multiprocessing_logger",
    "set_in_sighandler",
    "task_logger",
    "worker_logger",
]
