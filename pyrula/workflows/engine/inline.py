"""InlineWorkflowRunner: run a workflow to completion in this process, with no worker.

The test and script path. It has no background loops: no lease renewal, no orphan scan,
no timers. A run it executes must finish in one go; a delayed run is not waited for,
a run that would sleep or wait for a signal stalls, and schedules never fire. Anything
that needs those wants a :class:`~pyrula.workflows.WorkflowWorker`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from pyrula.workflows.client import RunHandle, WorkflowClient, outcome_of
from pyrula.workflows.engine.execution import ExecutionSettings
from pyrula.workflows.engine.runner import execute_run
from pyrula.workflows.errors import InvalidRunState
from pyrula.workflows.registry import Registry, WorkflowDefinition, default_registry
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.memory import MemoryStore

INLINE_LEASE_TTL = 3600.0
INLINE_CLAIM_LIMIT = 100
"""``execute`` claims up to this many due runs of the workflow to find the one it was
given; the others go straight back to their place in the queue."""


class InlineWorkflowRunner:
    """Submit and execute runs inline. ``store`` defaults to a fresh MemoryStore."""

    def __init__(self, store: Store | None = None, *, registry: Registry | None = None) -> None:
        self.store: Store = store if store is not None else MemoryStore()
        self._registry = registry or default_registry
        self.client = WorkflowClient(self.store, registry=self._registry)
        self.worker_id = f"inline-{uuid.uuid4().hex[:8]}"

    async def run(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None = None,
        **submit_options: Any,
    ) -> Any:
        """Submit a run, execute it here, and return its result (or raise as ``result()``)."""
        handle = await self.client.submit(workflow, params, **submit_options)
        return await self.execute(handle)

    async def execute(self, handle: RunHandle) -> Any:
        """Execute an already submitted, claimable run here and return its outcome."""
        definition = self._registry.get(handle.workflow)
        leases = await self.store.claim_runs(
            self.worker_id, [definition.name], limit=INLINE_CLAIM_LIMIT, lease_ttl=INLINE_LEASE_TTL
        )
        lease = next((x for x in leases if x.run_id == handle.run_id), None)
        for other in leases:
            if other is not lease:  # back at its original place, not behind the others
                await self.store.release_run(other.run_id, other.token, other.run.available_at)
        if lease is None:
            run = await handle.record()
            if run.is_terminal:
                return outcome_of(run)
            raise InvalidRunState(
                f"run {handle.run_id!r} is {run.status.value} and not claimable now "
                "(delayed, or held by a worker); InlineWorkflowRunner does not wait"
            )
        await execute_run(definition, lease, self.store, ExecutionSettings(registry=self._registry))
        return outcome_of(await handle.record())
