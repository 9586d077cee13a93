"""Logging for CLI processes. The library never configures logging; the CLI does, once."""

from __future__ import annotations

import logging
import sys

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class _CliHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` installs, so a second call can find it."""


def configure_logging(level: str) -> None:
    """Send records at ``level`` and above from every logger to stderr, one line each.

    Replaces the handler a previous call installed, so calling it twice (tests invoking
    several commands in one process) does not print each line twice.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _CliHandler):
            root.removeHandler(handler)
    handler = _CliHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(level.upper())
