"""Rate limits and per-owner concurrency: flow control enforced by the store.

``@workflow(rate_limit=Rate(per_second=10))`` lets every worker together start at most
ten runs of the workflow a second (Celery's ``rate_limit`` is per worker instance; this
one is shared). ``key`` splits the limit: a string is formatted with the run's params
(``Rate(key="api:{customer_id}", per_second=5)``), a callable gets the params dict.
``@workflow(owner_concurrency=N)`` caps running runs per owner (tenant).

Limits are computed when a run is submitted and travel with it, so the submitting
process must import the workflow (the default ``require_registered=True`` ensures it).
Held-back runs stay queued, keep their order, and are claimed as soon as the limit
allows: workers sleep until the bucket's next token rather than polling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyrula.workflows.errors import ConfigurationError, InvalidParams
from pyrula.workflows.records import NO_FLOW, FlowControl

if TYPE_CHECKING:
    from pyrula.workflows.registry import WorkflowDefinition

RateKey = str | Callable[[Mapping[str, Any]], str] | None


@dataclass(frozen=True)
class Rate:
    """At most ``per_second`` run starts a second per key, in bursts of up to ``burst``."""

    per_second: float
    key: RateKey = None
    burst: float = 1.0

    def __post_init__(self) -> None:
        for name in ("per_second", "burst"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigurationError(f"Rate.{name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ConfigurationError(f"Rate.{name} must be a positive number, got {value!r}")
        if self.burst < 1:
            raise ConfigurationError(f"Rate.burst must be at least 1, got {self.burst!r}")
        if self.key is not None and not (isinstance(self.key, str) or callable(self.key)):
            raise ConfigurationError("Rate.key takes a string template or a callable(params)")

    def key_for(self, workflow: str, params: Mapping[str, Any]) -> str:
        if self.key is None:
            return f"workflow:{workflow}"
        if callable(self.key):
            value = self.key(params)
            if not isinstance(value, str) or not value:
                raise InvalidParams(f"the rate key of {workflow!r} must return a non-empty str")
            return value
        try:
            return self.key.format(**params)
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidParams(
                f"rate key template {self.key!r} of workflow {workflow!r} needs param {exc}"
            ) from None


def check_owner_concurrency(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"owner_concurrency must be an int >= 1, got {value!r}")
    return value


def flow_for(definition: WorkflowDefinition, params: Mapping[str, Any]) -> FlowControl:
    """The flow control a run of ``definition`` with ``params`` carries."""
    rate = definition.rate_limit
    if rate is None and definition.owner_concurrency is None:
        return NO_FLOW
    return FlowControl(
        rate_key=None if rate is None else rate.key_for(definition.name, params),
        rate_per_second=None if rate is None else float(rate.per_second),
        rate_burst=1.0 if rate is None else float(rate.burst),
        owner_concurrency=definition.owner_concurrency,
    )
