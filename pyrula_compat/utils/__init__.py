"""``celery.utils``: the helpers projects import (``uuid``)."""

from __future__ import annotations

import uuid as _uuid


def uuid() -> str:
    """A new task id (a UUID4 string, as Celery's)."""
    return str(_uuid.uuid4())


gen_unique_id = uuid

__all__ = ["gen_unique_id", "uuid"]
