"""``celery.app.log``: the app's logging set-up (``app.log``), as Celery's worker does it.

``pyrula worker -A proj`` calls ``app.log.setup(...)`` once. As in Celery 5.7:

- ``setup_logging`` is sent first; if any receiver is connected, it owns logging and
  nothing else is configured (nor are stdout and stderr redirected);
- otherwise, with ``worker_hijack_root_logger`` (default on), the handlers of the root
  logger and of ``celery``, ``celery.task`` and ``celery.redirected`` are removed; the
  root logger gets a stderr (or ``logfile``) handler formatted by ``worker_log_format``
  and ``after_setup_logger`` is sent; the ``celery.task`` logger (the parent of every
  ``get_task_logger`` logger) gets its own handler formatted by
  ``worker_task_log_format``, whose records carry ``task_name`` and ``task_id``
  (:class:`TaskFormatter`), and ``after_setup_task_logger`` is sent;
- with ``worker_redirect_stdouts`` (default on), ``print()`` in a task goes to the
  ``celery.redirected`` logger at ``worker_redirect_stdouts_level`` (``WARNING``).

The process is set up once (:attr:`Logging.already_setup`). ``formatter`` (a pyrula
extension) replaces every format with one formatter: ``pyrula worker --log-format json``
passes its JSON formatter.
"""

from __future__ import annotations

import logging
import os
import sys
from logging.handlers import WatchedFileHandler
from typing import TYPE_CHECKING, Any, ClassVar, TextIO

from pyrula_compat import _state, signals
from pyrula_compat.utils.log import ColorFormatter, LoggingProxy, get_logger, mlevel

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

__all__ = ["Logging", "TaskFormatter", "TaskOutputProxy"]


class TaskFormatter(ColorFormatter):
    """Formatter for task loggers: fills ``task_name`` and ``task_id`` from the task
    running in this thread (``???`` outside a task)."""

    def format(self, record: logging.LogRecord) -> str:
        task = _state.get_current_task()
        request = task.request if task is not None else None
        if task is not None and request is not None and request.id is not None:
            record.__dict__.update(task_id=request.id, task_name=task.name)
        else:
            record.__dict__.setdefault("task_name", "???")
            record.__dict__.setdefault("task_id", "???")
        return super().format(record)


class _Configured:
    """Marks a handler app.log installed, so a second set-up finds the logger configured."""


class _StreamHandler(logging.StreamHandler, _Configured):  # type: ignore[type-arg]
    pass


class _FileHandler(WatchedFileHandler, _Configured):
    pass


class TaskOutputProxy(LoggingProxy):
    """A stream that sends what a task body writes (in the thread it runs in) to a
    logger, and everything else to the stream it replaced."""

    def __init__(self, logger: logging.Logger, loglevel: int | str | None, stream: Any) -> None:
        super().__init__(logger, loglevel)
        self.stream = stream

    def write(self, data: str) -> int:
        if _state.get_current_task() is None:
            written: int = self.stream.write(data)
            return written
        return super().write(data)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return bool(self.stream.isatty())

    def fileno(self) -> int:
        fileno: int = self.stream.fileno()
        return fileno


class Logging:
    """Application logging setup (``app.log``)."""

    _setup: ClassVar[bool] = False
    """The logging subsystem is configured once per process."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        conf = app.conf
        self.loglevel = mlevel(logging.WARNING)
        self.format: str = conf.worker_log_format
        self.datefmt: str | None = conf.worker_log_datefmt
        self.task_format: str = conf.worker_task_log_format
        self.task_datefmt: str | None = conf.worker_task_log_datefmt
        self.colorize: bool | None = conf.worker_log_color

    def setup(
        self,
        loglevel: int | str | None = None,
        logfile: str | TextIO | None = None,
        redirect_stdouts: bool = False,
        redirect_level: int | str = "WARNING",
        colorize: bool | None = None,
        hostname: str | None = None,
        formatter: logging.Formatter | None = None,
    ) -> bool:
        """Set up logging for a worker; True when a ``setup_logging`` receiver did it."""
        level = mlevel(loglevel) if loglevel is not None else None
        handled = self.setup_logging_subsystem(
            level, logfile, colorize=colorize, hostname=hostname, formatter=formatter
        )
        if not handled and redirect_stdouts:
            self.redirect_stdouts(redirect_level)
        os.environ.update(
            CELERY_LOG_LEVEL=str(level) if level else "",
            CELERY_LOG_FILE=str(logfile) if isinstance(logfile, str) else "",
        )
        logging.captureWarnings(True)
        return handled

    def redirect_stdouts(
        self, loglevel: int | str | None = None, name: str = "celery.redirected"
    ) -> None:
        self.redirect_stdouts_to_logger(get_logger(name), loglevel=loglevel)
        os.environ.update(CELERY_LOG_REDIRECT="1", CELERY_LOG_REDIRECT_LEVEL=str(loglevel or ""))

    def setup_logging_subsystem(
        self,
        loglevel: int | str | None = None,
        logfile: str | TextIO | None = None,
        format: str | None = None,
        colorize: bool | None = None,
        hostname: str | None = None,
        datefmt: str | None = None,
        formatter: logging.Formatter | None = None,
        **kwargs: Any,
    ) -> bool:
        """Configure the root and task loggers once (see the module docstring); True
        when a ``setup_logging`` receiver took it over. ``hostname`` fills ``%n``,
        ``%h`` and ``%d`` in ``logfile``, as Celery's node names do."""
        if self.already_setup:
            return False
        if isinstance(logfile, str) and hostname:
            logfile = _node_format(logfile, hostname)
        Logging._setup = True
        level = mlevel(loglevel or self.loglevel)
        format = format or self.format
        datefmt = self.datefmt if datefmt is None else datefmt
        colorize = self.supports_color(colorize, logfile)
        receivers = signals.setup_logging.send(
            sender=None, loglevel=level, logfile=logfile, format=format, colorize=colorize
        )
        for _, response in receivers:
            if isinstance(response, Exception):
                Logging._setup = False
                raise response
        if receivers:
            return True
        root = logging.getLogger()
        if self.app.conf.worker_hijack_root_logger:
            for name in (None, "celery", "celery.task", "celery.redirected"):
                logging.getLogger(name).handlers = []
        self.setup_handlers(root, logfile, format, colorize, datefmt=datefmt, instance=formatter)
        root.setLevel(level)
        signals.after_setup_logger.send(
            sender=None, logger=root, loglevel=level, logfile=logfile, format=format,
            colorize=colorize,
        )  # fmt: skip
        self.setup_task_loggers(level, logfile, colorize=colorize, formatter=formatter)
        return False

    def setup_task_loggers(
        self,
        loglevel: int | str | None = None,
        logfile: str | TextIO | None = None,
        format: str | None = None,
        colorize: bool | None = None,
        propagate: bool = False,
        datefmt: str | None = None,
        formatter: logging.Formatter | None = None,
        **kwargs: Any,
    ) -> logging.Logger:
        """Give the ``celery.task`` logger its handler (stderr unless ``logfile``),
        formatted by ``worker_task_log_format``; return it."""
        level = mlevel(loglevel or self.loglevel)
        format = format or self.task_format
        datefmt = self.task_datefmt if datefmt is None else datefmt
        colorize = self.supports_color(colorize, logfile)
        logger = self.setup_handlers(
            get_logger("celery.task"), logfile, format, colorize, formatter=TaskFormatter,
            datefmt=datefmt, instance=formatter,
        )  # fmt: skip
        logger.setLevel(level)
        logger.propagate = bool(propagate)
        signals.after_setup_task_logger.send(
            sender=None, logger=logger, loglevel=level, logfile=logfile, format=format,
            colorize=colorize,
        )  # fmt: skip
        return logger

    def redirect_stdouts_to_logger(
        self,
        logger: logging.Logger,
        loglevel: int | str | None = None,
        stdout: bool = True,
        stderr: bool = True,
    ) -> LoggingProxy:
        """Send what is written to ``sys.stdout`` / ``sys.stderr`` to ``logger``."""
        proxy = LoggingProxy(logger, loglevel)
        if stdout:
            sys.stdout = proxy
        if stderr:
            sys.stderr = proxy
        return proxy

    def redirect_task_output(
        self, loglevel: int | str | None = None, name: str = "celery.redirected"
    ) -> TaskOutputProxy:
        """``worker_redirect_stdouts`` in a pyrula worker (a pyrula extension): what task
        bodies write to ``sys.stdout`` / ``sys.stderr`` goes to the logger ``name`` at
        ``loglevel``; what the worker process writes itself (its banner, the CLI's
        notes) still goes to the stream, where scripts that start a worker read it."""
        out = TaskOutputProxy(get_logger(name), loglevel, _unwrapped(sys.stdout))
        err = TaskOutputProxy(get_logger(name), loglevel, _unwrapped(sys.stderr))
        sys.stdout, sys.stderr = out, err
        return out

    def supports_color(
        self, colorize: bool | None = None, logfile: str | TextIO | None = None
    ) -> bool:
        """Colors only when asked (or not said) and logging to a terminal's stderr."""
        colorize = self.colorize if colorize is None else colorize
        if colorize or colorize is None:
            return logfile is None and sys.stderr.isatty()
        return False

    def setup_handlers(
        self,
        logger: logging.Logger,
        logfile: str | TextIO | None,
        format: str,
        colorize: bool,
        formatter: type[ColorFormatter] = ColorFormatter,
        datefmt: str | None = None,
        instance: logging.Formatter | None = None,
        **kwargs: Any,
    ) -> logging.Logger:
        """Add a handler for ``logfile`` (a path, an open stream, or stderr) to
        ``logger`` unless it has one already; ``instance`` formats it instead of
        ``formatter(format)``."""
        if self._is_configured(logger):
            return logger
        handler = self._detect_handler(logfile)
        handler.setFormatter(
            instance if instance is not None else formatter(format, colorize, datefmt)
        )
        logger.addHandler(handler)
        return logger

    def _detect_handler(self, logfile: str | TextIO | None = None) -> logging.Handler:
        stream = sys.__stderr__ if logfile is None else logfile
        if stream is not None and not isinstance(stream, str):
            return _StreamHandler(stream)
        return _FileHandler(str(stream), encoding="utf-8")

    def _is_configured(self, logger: logging.Logger) -> bool:
        return any(not isinstance(h, logging.NullHandler) for h in logger.handlers)

    def get_default_logger(self, name: str = "celery", **kwargs: Any) -> logging.Logger:
        return get_logger(name)

    @property
    def already_setup(self) -> bool:
        return Logging._setup

    @already_setup.setter
    def already_setup(self, was_setup: bool) -> None:
        Logging._setup = was_setup


def _unwrapped(stream: Any) -> Any:
    """The stream under an earlier :class:`TaskOutputProxy` (set up again: not twice)."""
    return stream.stream if isinstance(stream, TaskOutputProxy) else stream


def _node_format(path: str, hostname: str) -> str:
    """Celery's node name placeholders: ``%n`` name, ``%h`` host name, ``%d`` domain."""
    name, _, host = hostname.partition("@")
    host = host or name
    domain = host.partition(".")[2]
    return path.replace("%n", name).replace("%h", host).replace("%d", domain)
