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

PRECEDENCE = [SUCCESS, FAILURE, None, REVOKED, STARTED, RECEIVED, REJECTED, RETRY, PENDING]
"""Celery's order of states, most advanced first; ``None`` stands for a custom state."""
_PRECEDENCE = {name: i for i, name in enumerate(PRECEDENCE)}


def precedence(name: str | None) -> int:
    """Where ``name`` stands in :data:`PRECEDENCE` (a custom state where ``None`` does)."""
    return _PRECEDENCE.get(name, _PRECEDENCE[None])


class state(str):  # Celery's name
    """A state name that compares by precedence: ``state(SUCCESS) > state(PENDING)``."""

    def __gt__(self, other: object) -> bool:
        return precedence(self) < precedence(_name(other))

    def __ge__(self, other: object) -> bool:
        return precedence(self) <= precedence(_name(other))

    def __lt__(self, other: object) -> bool:
        return precedence(self) > precedence(_name(other))

    def __le__(self, other: object) -> bool:
        return precedence(self) >= precedence(_name(other))


def _name(other: object) -> str | None:
    return other if isinstance(other, str) or other is None else str(other)


__all__ = [
    "ALL_STATES",
    "EXCEPTION_STATES",
    "FAILURE",
    "IGNORED",
    "PENDING",
    "PRECEDENCE",
    "PROPAGATE_STATES",
    "READY_STATES",
    "RECEIVED",
    "REJECTED",
    "RETRY",
    "REVOKED",
    "STARTED",
    "SUCCESS",
    "UNREADY_STATES",
    "precedence",
    "state",
]
