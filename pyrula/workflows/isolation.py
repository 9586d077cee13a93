"""Suspect runs run alone, so a run that kills its worker takes no healthy run with it.

A recovery counts against every run the dead worker held: the store cannot tell which
one killed it. Runs recovered together are queued together, so without care the next
claim takes the killer and its bystanders in one batch again, and they die with it until
all are dead-lettered. A run recovered ``SUSPECT_AFTER`` times (a single recovery is
what any node loss does to every run it held, and those should resume at full speed) is
a *suspect*: a worker starts one only when it has nothing else in flight, and claims
nothing more while it runs. A busy worker hands a claimed suspect back for
``DEFER_FOR`` seconds (an idle worker may take it meanwhile); after ``DRAIN_AFTER`` such
hand-backs of one run it stops claiming until its runs finish, then takes the suspect
alone, so a suspect is not starved by steady work.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyrula.workflows.records import Lease

SUSPECT_AFTER = 2
"""Recoveries after which a run is a suspect (fewer if ``max_recoveries`` is lower)."""
DEFER_FOR = 1.0
"""Seconds a busy worker hands a suspect back for."""
DRAIN_AFTER = 5
"""Hand-backs of one suspect by a worker after which it drains to run it alone."""
MAX_TRACKED = 1000
"""Suspects whose hand-backs a worker counts at most."""


@dataclass
class Plan:
    """What to do with one claimed batch."""

    start: list[Lease] = field(default_factory=list)
    alone: Lease | None = None
    """A suspect to start with nothing else in flight."""
    back: list[tuple[Lease, float]] = field(default_factory=list)
    """Leases to hand back, each with the seconds after its claim it is due again."""


class Isolation:
    """One worker's suspect policy (see the module docstring)."""

    def __init__(self, max_recoveries: int) -> None:
        self.threshold = max(1, min(SUSPECT_AFTER, max_recoveries))
        self.running: Any = None
        """The worker's entry of the suspect running alone, if any."""
        self.draining = False
        self._deferred: dict[str, int] = {}

    def suspect(self, lease: Lease) -> bool:
        return lease.run.recoveries >= self.threshold

    def blocks_claims(self, in_flight: int) -> bool:
        """Whether the worker must claim nothing now."""
        return self.running is not None or (self.draining and in_flight > 0)

    def plan(self, leases: list[Lease], in_flight: int) -> Plan:
        """Sort a claimed batch, ``in_flight`` runs already executing on the worker."""
        if in_flight == 0:
            self.draining = False  # drained (or never was): claims go on as usual
        suspects = [lease for lease in leases if self.suspect(lease)]
        if not suspects:
            return Plan(start=leases)
        others = [lease for lease in leases if not self.suspect(lease)]
        if in_flight == 0:
            alone, rest = suspects[0], suspects[1:]
            self._deferred.pop(alone.run_id, None)
            return Plan(alone=alone, back=[(lease, 0.0) for lease in [*rest, *others]])
        if len(self._deferred) > MAX_TRACKED:
            self._deferred.clear()  # suspects other workers ran meanwhile
        for lease in suspects:
            count = self._deferred[lease.run_id] = self._deferred.get(lease.run_id, 0) + 1
            if count >= DRAIN_AFTER:
                self.draining = True
        return Plan(start=others, back=[(lease, DEFER_FOR) for lease in suspects])
