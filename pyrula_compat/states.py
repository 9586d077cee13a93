"""Celery's task states (``celery.states``) and the sets built from them."""

from __future__ import annotations

PENDING = "PENDING"
"""Queued (possibly delayed), or an id no run has."""
RECEIVED = "RECEIVED"
STARTED = "STARTED"
"""Running on a worker."""
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"
"""Revoked (cancelled or terminated) or expired before it started."""
REJECTED = "REJECTED"
RETRY = "RETRY"
"""Waiting for its next attempt."""
IGNORED = "IGNORED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})

ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})

__all__ = [
    "ALL_STATES",
    "EXCEPTION_STATES",
    "FAILURE",
    "IGNORED",
    "PENDING",
    "PROPAGATE_STATES",
    "READY_STATES",
    "RECEIVED",
    "REJECTED",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "UNREADY_STATES",
]
