"""Logging for CLI processes. The library never configures logging; the CLI does, once."""

from __future__ import annotations

import logging
import logging.handlers
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pyrula.cli.render import CliUsageError
from pyrula.workflows.log_context import LOG_FORMAT_ENV, JsonFormatter

F = TypeVar("F", bound=Callable[..., Any])

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` installs, so a second call can find it."""


class _CliFileHandler(logging.handlers.WatchedFileHandler):
    """The handler for ``--logfile``: appends, and reopens the file when logrotate moved
    it."""


def configure_logging(level: str, logfile: str | None = None, log_format: str = "text") -> None:
    """Send records at ``level`` and above from every logger to stderr (to ``logfile``,
    appended, if given), one line each: text, or with ``log_format="json"`` one JSON
    object (:class:`~pyrula.workflows.log_context.JsonFormatter`).

    Replaces the handler a previous call installed, so calling it twice (tests invoking
    several commands in one process) does not print each line twice.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        if isinstance(old, (_CliHandler, _CliFileHandler)):
            root.removeHandler(old)
            old.close()
    handler: logging.Handler
    try:
        handler = _CliFileHandler(logfile) if logfile else _CliHandler(sys.stderr)
    except OSError as exc:
        raise CliUsageError(f"--logfile {logfile}: {exc.strerror}") from None
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())


def loglevel_option(*, logfile: bool = False) -> Callable[[F], F]:
    """The ``-l/--loglevel`` option of the commands that log (``logfile``: the command
    has ``--logfile`` too)."""
    where = "stderr (or --logfile)" if logfile else "stderr"
    return click.option(
        "--loglevel",
        "-l",
        type=click.Choice(LEVELS, case_sensitive=False),
        default="INFO",
        show_default=True,
        help=f"Log records at this level and above go to {where}.",
    )


def log_format_option(command: F) -> F:
    """``--log-format text|json`` (also ``PYRULA_LOG_FORMAT``), as ``log_format``."""
    return click.option(
        "--log-format",
        "log_format",
        type=click.Choice(LOG_FORMATS, case_sensitive=False),
        default="text",
        envvar=LOG_FORMAT_ENV,
        show_envvar=True,
        show_default=True,
        help="json: one JSON object a line (time, level, logger, message, and the run, "
        "workflow or task, step, attempt and worker it is about).",
    )(command)
