"""RetryPolicy and the backoff maths for step retries."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from pyrula.workflows.errors import ConfigurationError, Fatal, Poison, StepInsideStep, Transient


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing step is retried.

    ``max_attempts`` counts attempts, not retries (1 = never retry). The n-th retry waits
    ``min(max_backoff, initial_backoff * backoff_coefficient ** (n - 1))`` seconds, then
    ``jitter`` (a fraction in [0, 1]) randomises it downwards by up to that fraction.
    ``retryable`` lists the exception types that are retried; :class:`Transient` is always
    retried and :class:`Poison` / :class:`Fatal` never, whatever ``retryable`` says.
    """

    max_attempts: int = 3
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    backoff_coefficient: float = 2.0
    jitter: float = 0.1
    retryable: tuple[type[BaseException], ...] = field(default=(Exception,))

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be an int >= 1, got {self.max_attempts!r}"
            )
        for name in ("initial_backoff", "max_backoff", "backoff_coefficient", "jitter"):
            value = getattr(self, name)
            # NaN passes every comparison below, and a NaN backoff breaks asyncio.sleep.
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise ConfigurationError(f"RetryPolicy.{name} must be a number, got {value!r}")
        if self.initial_backoff < 0 or self.max_backoff < 0:
            raise ConfigurationError("RetryPolicy backoffs must be >= 0 seconds")
        if self.backoff_coefficient < 1:
            raise ConfigurationError("RetryPolicy.backoff_coefficient must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigurationError("RetryPolicy.jitter must be between 0 and 1")
        retryable = self.retryable
        if isinstance(retryable, type):
            retryable = (retryable,)
            object.__setattr__(self, "retryable", retryable)
        for kind in retryable:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ConfigurationError(
                    f"RetryPolicy.retryable must hold exception classes, got {kind!r}"
                )

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """Whether a failure on ``attempt`` (1-based) is retried."""
        if attempt >= self.max_attempts:
            return False
        if isinstance(exc, (Poison, Fatal, StepInsideStep)):  # the last: a bug in the code
            return False
        if isinstance(exc, Transient):
            return True
        if not isinstance(exc, Exception):
            return False  # KeyboardInterrupt, SystemExit and friends are never retried
        return isinstance(exc, self.retryable)

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed ``attempt`` (1-based) before the next one."""
        base = min(
            self.max_backoff, self.initial_backoff * self.backoff_coefficient ** (attempt - 1)
        )
        if self.jitter:
            base *= 1 - self.jitter * (rng or random).random()
        return max(0.0, base)


NO_RETRY = RetryPolicy(max_attempts=1)
