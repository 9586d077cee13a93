"""The trigger loop: start one run per ready batch of a batch trigger's events.

Firing a batch, with any number of workers doing it at once (see
:mod:`pyrula.workflows.triggers`):

1. read the buffer's oldest ``max_size`` events; a batch is ready when there are
   ``max_size`` of them or the oldest has waited ``max_wait`` (store time);
2. create the batch's run, whose id and idempotency key are derived from the trigger and
   its first event (seq and store time), with the events as its parameter;
3. consume the events the run holds (``Store.consume_events``: only if the first is
   still the oldest).

A worker that crashes between 2 and 3 leaves the events buffered; whoever fires next
reads the same first event, so it derives the same run and consumes what that run
holds (another worker may have read more events since: the run's own parameter says
how many are its). Nothing is lost and no batch runs twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyrula.workflows.errors import IdempotencyConflict, InvalidRunState, StoreError
from pyrula.workflows.rate import flow_for
from pyrula.workflows.records import DEFAULT_OWNER, NO_FLOW, NewRun, RunRecord, TriggerEvent
from pyrula.workflows.serialization import DEFAULT_MAX_PAYLOAD_BYTES
from pyrula.workflows.stores.base import events_of
from pyrula.workflows.triggers import BatchTrigger

if TYPE_CHECKING:
    from pyrula.workflows.registry import WorkflowDefinition
    from pyrula.workflows.stores.base import Store
    from pyrula.workflows.worker import WorkflowWorker

log = logging.getLogger("pyrula.workflows.worker")

BATCHES_PER_LOOK = 20
"""Most batches one trigger fires in one look before the loop serves the others."""
PARAMS_OVERHEAD = 64
"""Bytes of a batch's params besides its events (the parameter's name, brackets)."""


def batch_run_id(trigger: str, first: TriggerEvent) -> str:
    """The id of the run a batch starting at ``first`` becomes (the same in every worker)."""
    digest = hashlib.sha256(f"{trigger}\x00{first.seq}\x00{first.created_at!r}".encode())
    return f"trigger-{digest.hexdigest()[:32]}"


def batch_key(trigger: str, first: TriggerEvent) -> str:
    """The idempotency key of that run."""
    return f"pyrula:trigger:{trigger}:{first.seq}:{first.created_at!r}"


def batch_params(param: str, payloads: Sequence[str]) -> str:
    """The run's params as JSON text: ``{param: [event, ...]}``. The payloads are JSON
    texts already (checked when sent), so they are joined, not decoded and encoded."""
    return "{" + json.dumps(param) + ":[" + ",".join(payloads) + "]}"


def fitting(events: Sequence[TriggerEvent], max_bytes: int) -> int:
    """How many of ``events``, from the first, fit in one run's params (at least one)."""
    size = PARAMS_OVERHEAD
    for count, event in enumerate(events):
        size += len(event.payload.encode("utf-8")) + 1
        if size > max_bytes:
            return max(count, 1)
    return len(events)


class TriggerFirer:
    """Fires the ready batches of batch triggers on one store."""

    def __init__(
        self,
        store: Store,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        definitions: dict[str, WorkflowDefinition] | None = None,
    ) -> None:
        self.store = store
        self.events = events_of(store, "batch triggers")
        self.max_payload_bytes = max_payload_bytes
        self.definitions = definitions or {}

    async def fire_ready(self, trigger: BatchTrigger) -> float | None:
        """Start a run for each ready batch of ``trigger`` (up to BATCHES_PER_LOOK); return
        the seconds until its buffer should be looked at again (0: more may be ready), or
        None when the buffer is empty or its first batch cannot be fired (logged)."""
        for _ in range(BATCHES_PER_LOOK):
            events = await self.events.read_events(trigger.name, trigger.max_size)
            if not events:
                return None
            now = await self.store.now()
            due = events[0].created_at + trigger.max_wait
            if len(events) < trigger.max_size and now < due:
                return due - now
            if await self.fire(trigger, events) is None:
                return None
        return 0.0

    async def fire(self, trigger: BatchTrigger, events: Sequence[TriggerEvent]) -> RunRecord | None:
        """Start the run of the batch that begins with ``events[0]`` (holding as many of
        ``events`` as fit) and consume its events; return the run, or None when the batch
        cannot be resolved (logged)."""
        first = events[0]
        batch = events[: fitting(events, self.max_payload_bytes)]
        definition = self.definitions.get(trigger.workflow)
        params = batch_params(trigger.param, [event.payload for event in batch])
        new = NewRun(
            run_id=batch_run_id(trigger.name, first),
            workflow=trigger.workflow,
            params=params,
            owner=DEFAULT_OWNER,
            idempotency_key=batch_key(trigger.name, first),
            flow=NO_FLOW if definition is None else flow_for(definition, json.loads(params)),
        )
        try:
            record, _ = await self.store.create_run(new)
            count = len(batch)
        except IdempotencyConflict:
            # Another worker created this batch's run with more or fewer events: its own
            # parameter says which are its.
            existing = await self.store.get_run(new.run_id)
            if existing is None:
                log.error(
                    "trigger %r: the run of the batch from event %d is gone but its "
                    "idempotency key remains; its events stay buffered",
                    trigger.name,
                    first.seq,
                )
                return None
            record = existing
            held = self._held(trigger, record)
            if held is None:
                return None
            count = held
        except InvalidRunState as exc:
            log.error(
                "trigger %r: run id %s is taken by another run (%s); the batch from event "
                "%d stays buffered",
                trigger.name,
                new.run_id,
                exc,
                first.seq,
            )
            return None
        if await self.events.consume_events(trigger.name, first.seq, count):
            log.info(
                "trigger %r started run %s with %d event(s)", trigger.name, record.run_id, count
            )
        return record

    @staticmethod
    def _held(trigger: BatchTrigger, record: RunRecord) -> int | None:
        try:
            events = json.loads(record.params)[trigger.param]
        except (ValueError, KeyError, TypeError):
            events = None
        if not isinstance(events, list) or not events:
            log.error(
                "trigger %r: run %s does not hold a list of events in its %r parameter; "
                "the batch stays buffered",
                trigger.name,
                record.run_id,
                trigger.param,
            )
            return None
        return len(events)


async def next_batch_at(store: Store, trigger: BatchTrigger) -> float | None:
    """Store time at which ``trigger``'s next batch is (or was) ready, None when its
    buffer is empty (``WorkflowTestEnv`` skips virtual time to it)."""
    events = await events_of(store, "batch triggers").read_events(trigger.name, trigger.max_size)
    if not events:
        return None
    if len(events) >= trigger.max_size:
        return events[-1].created_at
    return events[0].created_at + trigger.max_wait


async def trigger_loop(worker: WorkflowWorker, triggers: Sequence[BatchTrigger]) -> None:
    """Fire the ready batches of ``triggers``; sleep until the next oldest event is due,
    capped by ``trigger_poll_interval``."""
    firer = TriggerFirer(
        worker.store,
        max_payload_bytes=worker.options.max_payload_bytes,
        definitions={d.name: d for d in worker.workflows},
    )
    while True:
        delay = worker.options.trigger_poll_interval
        for trigger in triggers:
            try:
                again = await firer.fire_ready(trigger)
            except StoreError as exc:
                log.warning("trigger %r: firing failed: %s", trigger.name, exc)
                continue
            except Exception:  # one bad trigger must not stop the others
                log.exception("trigger %r: firing failed", trigger.name)
                continue
            if again is not None:
                delay = min(delay, again)
        if delay > 0:
            await worker.wait_stop_or(delay)
