"""``DjangoTask``: ``delay_on_commit`` and ``apply_async_on_commit`` (Celery 5.4+).

The submit is deferred to ``transaction.on_commit``, so a task never runs before the
row it reads is committed. Like Celery's, these return None (the id is not known until
the commit). Apps made while ``DJANGO_SETTINGS_MODULE`` is set use this class for
their tasks, as Celery's Django fix-up does.
"""

from __future__ import annotations

import functools
from typing import Any

from pyrula_compat.app.task import Task


class DjangoTask(Task):
    """A task with Django's on-commit calls."""

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``delay(*args, **kwargs)`` once the current transaction commits."""
        from django.db import transaction

        transaction.on_commit(functools.partial(self.delay, *args, **kwargs))

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """``apply_async(...)`` once the current transaction commits."""
        from django.db import transaction

        transaction.on_commit(functools.partial(self.apply_async, *args, **kwargs))


__all__ = ["DjangoTask"]
