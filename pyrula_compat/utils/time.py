"""``celery.utils.time``: the helpers projects import from it."""

from __future__ import annotations

import numbers
import random
from datetime import timedelta
from typing import Any


def get_exponential_backoff_interval(
    factor: float, retries: int, maximum: float, full_jitter: bool = False
) -> Any:
    """``min(maximum, factor * 2**retries)``; with ``full_jitter``, a uniform integer in
    ``[0, that]`` instead (what ``retry_backoff`` waits before retry ``retries``)."""
    countdown = min(maximum, factor * (2**retries))
    if full_jitter:
        countdown = random.randrange(int(countdown) + 1)
    return max(0, countdown)


def maybe_timedelta(delta: Any) -> Any:
    """A number of seconds as a ``timedelta``; anything else as it is."""
    if isinstance(delta, numbers.Real):
        return timedelta(seconds=float(delta))
    return delta


__all__ = ["get_exponential_backoff_interval", "maybe_timedelta"]
