"""RetryPolicy: validation, classification and the backoff maths."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from pyrula.workflows import (
    ConfigurationError,
    Fatal,
    Poison,
    RetryPolicy,
    Step,
    Transient,
    step,
)


def test_backoff_grows_by_the_coefficient_and_is_capped() -> None:
    policy = RetryPolicy(
        max_attempts=10, initial_backoff=0.5, backoff_coefficient=3, max_backoff=10, jitter=0
    )
    assert [policy.backoff(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 10, 10]


def test_coefficient_one_is_a_constant_backoff() -> None:
    policy = RetryPolicy(initial_backoff=2, backoff_coefficient=1, jitter=0)
    assert {policy.backoff(n) for n in range(1, 20)} == {2}


def test_jitter_only_shortens_and_by_at_most_its_fraction() -> None:
    policy = RetryPolicy(initial_backoff=1, backoff_coefficient=2, max_backoff=8, jitter=0.25)
    rng = random.Random(1234)
    for attempt in range(1, 8):
        base = min(8, 2 ** (attempt - 1))
        samples = [policy.backoff(attempt, rng) for _ in range(200)]
        assert all(base * 0.75 <= s <= base for s in samples)
        assert max(samples) - min(samples) > base * 0.1  # it does vary


def test_full_jitter_stays_non_negative() -> None:
    policy = RetryPolicy(initial_backoff=1, jitter=1)
    rng = random.Random(5)
    assert all(0 <= policy.backoff(1, rng) <= 1 for _ in range(100))


def test_should_retry_counts_attempts_and_classifies() -> None:
    policy = RetryPolicy(max_attempts=3, retryable=(ConnectionError,))
    assert policy.should_retry(ConnectionError(), 1)
    assert policy.should_retry(ConnectionError(), 2)
    assert not policy.should_retry(ConnectionError(), 3)
    assert not policy.should_retry(ValueError(), 1)
    assert policy.should_retry(Transient(), 1)
    assert not policy.should_retry(Transient(), 3)
    broad = RetryPolicy(max_attempts=5, retryable=(BaseException,))
    assert not broad.should_retry(Poison(), 1)
    assert not broad.should_retry(Fatal(), 1)
    assert not broad.should_retry(KeyboardInterrupt(), 1)
    assert not broad.should_retry(SystemExit(1), 1)


def test_a_bare_exception_class_is_accepted_as_retryable() -> None:
    assert RetryPolicy(retryable=ConnectionError).retryable == (ConnectionError,)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_attempts": 1.5},
        {"max_attempts": "3"},
        {"initial_backoff": -0.1},
        {"max_backoff": -1},
        {"initial_backoff": math.nan},
        {"max_backoff": math.nan},
        {"backoff_coefficient": 0.5},
        {"backoff_coefficient": math.nan},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"jitter": math.nan},
        {"retryable": (int,)},
        {"retryable": ("ValueError",)},
        {"retryable": (ValueError, 3)},
    ],
    ids=repr,
)
def test_invalid_policies_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)


@pytest.mark.parametrize("timeout", [0, -1])
def test_step_timeout_must_be_positive(timeout: float) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        step(timeout=timeout)(lambda ctx: None)


def test_step_retry_must_be_a_policy() -> None:
    with pytest.raises(ConfigurationError, match="RetryPolicy"):
        Step(lambda ctx: None, retry={"max_attempts": 3})  # type: ignore[arg-type]
