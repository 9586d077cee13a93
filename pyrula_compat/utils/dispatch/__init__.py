"""``celery.utils.dispatch``: the observer pattern behind every signal (``Signal``)."""

from __future__ import annotations

from pyrula_compat.utils.dispatch.signal import Signal

__all__ = ["Signal"]
