"""Sending a task while the store blips: Celery's publish retry.

Celery retries a publish that meets a connection error (``task_publish_retry``, on by
default) as ``task_publish_retry_policy`` says (kombu's ``retry_over_time``): up to
``max_retries`` more tries (None: no end), sleeping ``interval_start`` seconds, then
``interval_step`` more each time, never more than ``interval_max``; a ``timeout`` (in
seconds) ends it sooner. ``apply_async(retry=False)`` or ``retry_policy={...}`` (merged
over the setting) decide for one call. When the tries run out, the call raises
:class:`~pyrula_compat.exceptions.OperationalError` (kombu's, when kombu is installed),
what Celery code catches around ``.delay()``, with the store's ``StoreUnavailable`` as
its cause. Only an unreachable store is retried: any other error is raised at once.
"""

from __future__ import annotations

import itertools
import numbers
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pyrula.workflows.errors import StoreUnavailable
from pyrula_compat.exceptions import OperationalError

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

T = TypeVar("T")
POLICY_KEYS = ("max_retries", "interval_start", "interval_step", "interval_max", "timeout")


def policy_of(app: Celery, options: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
    """Whether to retry, and the policy: the call's ``retry`` / ``retry_policy`` over the
    app's ``task_publish_retry`` / ``task_publish_retry_policy``, as Celery merges them."""
    retry = options.get("retry")
    if retry is None:
        retry = app.conf.task_publish_retry
    policy = dict(app.conf.task_publish_retry_policy or {})
    policy.update(options.get("retry_policy") or {})
    for key in POLICY_KEYS:
        value = policy.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            raise TypeError(
                f"task_publish_retry_policy[{key!r}] takes a number (seconds, or a count "
                f"for max_retries) or None, got {value!r}"
            )
    return bool(retry), policy


def intervals(policy: Mapping[str, Any]) -> Iterator[float]:
    """The sleeps between tries, as kombu's ``retry_over_time`` makes them:
    ``interval_start``, then ``interval_step`` more each time, capped at
    ``interval_max``."""
    start = float(policy.get("interval_start", 2) or 0)
    step = float(policy.get("interval_step", 2) or 0)
    top = float(policy.get("interval_max", 30) or 0)
    return (min(start + step * n, top) for n in itertools.count())


def send(what: str, attempt: Callable[[int], T], retry: bool, policy: Mapping[str, Any]) -> T:
    """``attempt(n)`` (n: 1 for the first try) until it does not raise
    :class:`StoreUnavailable`, as ``policy`` allows; then :class:`OperationalError`
    naming ``what`` and the tries made."""
    max_retries = policy.get("max_retries") if retry else 0
    timeout = policy.get("timeout")
    end = time.monotonic() + float(timeout) if timeout else None
    sleeps = intervals(policy)
    for tries in itertools.count(1):
        try:
            return attempt(tries)
        except StoreUnavailable as exc:
            retries = tries - 1
            out = max_retries is not None and retries >= max_retries
            if out or (end is not None and time.monotonic() > end):
                tried = f"{tries} tr{'y' if tries == 1 else 'ies'}"
                how = (
                    "task_publish_retry is off" if not retry
                    else f"task_publish_retry_policy {dict(policy)}"
                )  # fmt: skip
                raise OperationalError(f"{what} not sent after {tried} ({how}): {exc}") from exc
            pause = next(sleeps)
            if pause > 0:
                time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["intervals", "policy_of", "send"]
