"""``celery.utils.log``: task loggers are children of ``celery.task``, as in Celery."""

from __future__ import annotations

import logging

task_logger = logging.getLogger("celery.task")
worker_logger = logging.getLogger("celery.worker")


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


__all__ = ["get_logger", "get_task_logger", "task_logger", "worker_logger"]
