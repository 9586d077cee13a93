"""Module paths and helpers projects import from Celery besides the main ones:
``celery.states.state``, ``celery.utils.time``, ``celery._state``,
``celery.exceptions.OperationalError`` (no worker, no server)."""

from __future__ import annotations

from datetime import timedelta

import pyrula_compat
from pyrula_compat import _state, states
from pyrula_compat.exceptions import OperationalError
from pyrula_compat.utils.time import get_exponential_backoff_interval, maybe_timedelta


def test_states_compare_by_precedence() -> None:
    state = states.state
    assert state(states.SUCCESS) > state(states.PENDING)
    assert state(states.FAILURE) > states.STARTED and state(states.RETRY) < states.STARTED
    assert state("PROGRESS") > states.REVOKED  # a custom state stands where None does
    assert state("PROGRESS") < states.FAILURE and state(states.PENDING) <= states.PENDING
    assert states.precedence(states.SUCCESS) == 0 and states.precedence("X") == 2
    assert sorted([states.PENDING, states.SUCCESS, states.STARTED], key=state) == [
        states.PENDING, states.STARTED, states.SUCCESS,
    ]  # fmt: skip


def test_utils_time_helpers() -> None:
    assert [get_exponential_backoff_interval(2, r, 100) for r in range(7)] == [
        2, 4, 8, 16, 32, 64, 100,
    ]  # fmt: skip
    assert {get_exponential_backoff_interval(1, 2, 600, full_jitter=True) for _ in range(200)} == {
        0, 1, 2, 3, 4,
    }  # fmt: skip
    assert maybe_timedelta(30) == timedelta(seconds=30)
    assert maybe_timedelta(timedelta(minutes=1)) == timedelta(minutes=1)


def test_state_module_proxies_are_the_packages() -> None:
    assert _state.current_app is pyrula_compat.current_app
    assert _state.current_task is pyrula_compat.current_task
    assert _state.current_app.main == _state.get_current_app().main
    assert not _state.current_task  # no task runs in this thread


def test_operational_error_is_importable_and_raisable() -> None:
    try:
        raise OperationalError("the store is away")
    except OperationalError as exc:
        assert str(exc) == "the store is away"
