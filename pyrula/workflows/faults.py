"""Named fault points for fault-injection tests. Off unless ``PYRULA_FAULTPOINTS`` is set.

``PYRULA_FAULTPOINTS="after_step_before_journal=kill@0.2;after_journal_before_reply=raise@0.5"``
turns points on: each ``point=action@probability`` (probability defaults to 1). Actions:

* ``kill``: SIGKILL this process (no cleanup, like a crash);
* ``raise``: raise :class:`~pyrula.workflows.errors.StoreUnavailable` (a lost reply);
* ``sleep:S``: sleep S seconds, blocking the thread;
* ``stop``: SIGSTOP this process (a paused lock holder; SIGCONT resumes it).

``PYRULA_FAULT_SEED`` seeds the dice; the seed in use is logged at WARNING so a failure
replays. Points: after_claim, step_started, after_step_before_journal,
after_journal_before_reply, before_outcome, skip_lease_renewal, and the archiver's
(:mod:`pyrula.workflows.stores.archive.reconcile`, one hit per batch written):

* ``archive_before_pg_write``: a batch of ended runs and their journals read from the
  live store, nothing of it written to the archive yet;
* ``archive_after_pg_commit_before_hot_delete``: the batch committed to the archive, the
  archive's cursor not moved past it yet, and none of it purged from the live store (the
  purge comes later, from ``expire_archived``, once a pass that vouched for the batch is
  ``live_ttl_after_archive`` old; a SIGKILL here loses that in-memory vouching).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import time
from dataclasses import dataclass

from pyrula.workflows.errors import StoreUnavailable

log = logging.getLogger(__name__)

POINTS = frozenset(
    {
        "after_claim",
        "step_started",
        "after_step_before_journal",
        "after_journal_before_reply",
        "before_outcome",
        "skip_lease_renewal",
        "archive_before_pg_write",
        "archive_after_pg_commit_before_hot_delete",
    }
)


@dataclass(frozen=True)
class _Rule:
    action: str
    argument: float
    probability: float


class _Faults:
    def __init__(self, spec: str, seed: int) -> None:
        self.rules: dict[str, _Rule] = {}
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            point, _, rest = part.partition("=")
            action, _, prob = rest.partition("@")
            verb, _, arg = action.partition(":")
            if point not in POINTS or verb not in {"kill", "raise", "sleep", "stop"}:
                raise ValueError(f"bad PYRULA_FAULTPOINTS entry {part!r}")
            self.rules[point] = _Rule(verb, float(arg or 0), float(prob or 1))
        self.rng = random.Random(seed)

    def hit(self, point: str) -> bool:
        rule = self.rules.get(point)
        if rule is None or self.rng.random() >= rule.probability:
            return False
        log.warning("fault point %s: %s", point, rule.action)
        if rule.action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif rule.action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif rule.action == "sleep":
            time.sleep(rule.argument)
        elif rule.action == "raise":
            raise StoreUnavailable(f"injected fault at {point}: the reply was lost")
        return True


_state: _Faults | None = None
_loaded = False


def fault_point(point: str) -> bool:
    """Trigger the fault configured for ``point``, if any; True when one fired."""
    global _state, _loaded
    if not _loaded:
        _loaded = True
        spec = os.environ.get("PYRULA_FAULTPOINTS", "")
        if spec:
            seed = int(os.environ.get("PYRULA_FAULT_SEED") or random.randrange(2**32))
            log.warning("fault points on (seed %d): %s", seed, spec)
            _state = _Faults(spec, seed)
    return _state.hit(point) if _state is not None else False
