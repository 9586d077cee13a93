"""Hard time limits: code that must not run past a deadline, ended by killing its process.

Python cannot stop a thread blocked in C (``time.sleep``, a socket read): an exception
raised into it arrives only when the call returns. Only a process can be ended at a
moment's notice, so a hard limit is enforced by whoever supervises the process: the
parent of a process pool (``pyrula worker --processes N``, ``pyrula worker -A proj``'s
prefork pool) kills the pool process at the limit, records ``error`` as the run's
failure (fenced by the run's lease) and starts a fresh process.

A pool process installs its enforcer with :func:`set_enforcer`; code about to run under
a limit calls :func:`arm` and, once done, :func:`disarm`. :func:`arm` returns False when
nothing here can kill this process (a threads or solo pool): the caller then falls back
to what a thread can do (an exception raised into it, delivered at its next bytecode).
"""

from __future__ import annotations

from typing import Protocol

from pyrula.workflows.serialization import ErrorInfo

__all__ = ["HardLimitEnforcer", "HardTimeout", "arm", "disarm", "enforced", "set_enforcer"]


class HardTimeout(float):
    """A step's ``timeout`` (seconds) given with ``hard=True`` (``@step(timeout=5,
    hard=True)``): in a pool process the step's process is killed at the limit."""


class HardLimitEnforcer(Protocol):
    """Kills this process ``seconds`` from now (recording ``error`` as the failure of
    the run it executes) unless :meth:`disarm` comes first."""

    def arm(self, seconds: float, error: ErrorInfo) -> None: ...

    def disarm(self) -> None: ...


_enforcer: HardLimitEnforcer | None = None


def set_enforcer(enforcer: HardLimitEnforcer | None) -> None:
    """Install (or, with None, remove) this process's enforcer."""
    global _enforcer
    _enforcer = enforcer


def enforced() -> bool:
    """Whether a hard limit armed here kills this process at its deadline."""
    return _enforcer is not None


def arm(seconds: float, error: BaseException | ErrorInfo) -> bool:
    """Have this process killed ``seconds`` from now, its run failing with ``error``;
    False (and nothing armed) when no enforcer is installed. One limit at a time: a
    pool process executes one run, one body at a time."""
    enforcer = _enforcer
    if enforcer is None:
        return False
    info = error if isinstance(error, ErrorInfo) else ErrorInfo.from_exception(error)
    enforcer.arm(seconds, info)
    return True


def disarm() -> None:
    """The code under the limit returned: kill nothing."""
    enforcer = _enforcer
    if enforcer is not None:
        enforcer.disarm()
