"""The async WorkflowClient and RunHandle."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pyrula.workflows import purging, telemetry
from pyrula.workflows.engine.rerun import retry_run
from pyrula.workflows.errors import (
    ConfigurationError,
    DurableInvocationError,
    InvalidParams,
    ResultTimeout,
    RunCancelled,
    RunNotFound,
)
from pyrula.workflows.rate import flow_for
from pyrula.workflows.records import DEFAULT_OWNER, NO_FLOW, NewRun, RunRecord, RunStatus
from pyrula.workflows.registry import Registry, WorkflowDefinition, default_registry
from pyrula.workflows.serialization import DEFAULT_MAX_PAYLOAD_BYTES, ErrorInfo, decode, encode
from pyrula.workflows.stores.base import Store, events_of, history_of, signals_of
from pyrula.workflows.triggering import PARAMS_OVERHEAD
from pyrula.workflows.triggers import check_name

Delay = float | int | timedelta


def seconds(value: Delay, what: str) -> float:
    """A delay as float seconds; negative or non-finite values are refused."""
    result = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(result, bool) or not isinstance(result, (int, float)):
        raise InvalidParams(f"{what} must be seconds or a timedelta, got {value!r}")
    if not math.isfinite(result) or result < 0:
        raise InvalidParams(f"{what} must be a finite, non-negative duration, got {value!r}")
    return float(result)


MAX_IDENTIFIER_LENGTH = 1000
"""The longest run id, idempotency key, owner or signal name, in characters (Temporal's
limit on a workflow id): each is part of store keys and index entries."""


def storable_text(value: str, what: str) -> None:
    """Raise InvalidParams unless ``value`` can be an identifier in every store: valid
    UTF-8 text (no lone surrogate) without a NUL character (which Postgres text, and so
    the archive, cannot hold), at most :data:`MAX_IDENTIFIER_LENGTH` characters."""
    if len(value) > MAX_IDENTIFIER_LENGTH:
        raise InvalidParams(
            f"{what} is {len(value):,} characters long ({value[:40]!r}...); at most "
            f"{MAX_IDENTIFIER_LENGTH:,} are allowed (it is part of store keys and indexes): "
            "keep long data in params"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidParams(
            f"{what} {value!r} holds a lone surrogate ({exc.object[exc.start : exc.end]!r}), "
            "which is not valid UTF-8 text and cannot be stored"
        ) from None
    if "\x00" in value:
        raise InvalidParams(f"{what} {value!r} holds a NUL character, which cannot be stored")


def epoch(value: datetime | float, name: str) -> float:
    """``value`` (an aware datetime or epoch seconds) as epoch seconds; ``name`` is the
    argument's, for the error."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidParams(
                f"{name}={value!r} has no timezone; pass an aware datetime "
                "(e.g. datetime.now(timezone.utc) + ...)"
            )
        return value.timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParams(f"{name} must be an aware datetime or epoch seconds, got {value!r}")
    return float(value)


class RunHandle:
    """A run, by id. Cheap to create; every method asks the store."""

    def __init__(self, store: Store, workflow: str, run_id: str) -> None:
        self._store = store
        self.workflow = workflow
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"RunHandle(workflow={self.workflow!r}, run_id={self.run_id!r})"

    async def record(self) -> RunRecord:
        """The run's full record. Raises RunNotFound."""
        run = await self._store.get_run(self.run_id)
        if run is None:
            raise RunNotFound(f"no run with id {self.run_id!r} in {self._store.url}")
        return run

    async def status(self) -> RunStatus:
        return (await self.record()).status

    async def result(self, timeout: float | None = None) -> Any:
        """Wait for the run to end and return its result.

        Raises :class:`DurableInvocationError` if it failed (or was dead-lettered),
        :class:`RunCancelled` if it was cancelled or terminated, :class:`ResultTimeout`
        if ``timeout`` seconds pass first. The wait sleeps until the store says the run
        ended; it does not poll.
        """
        run = await self._store.wait_run(self.run_id, timeout)
        return outcome_of(run)

    async def signal(self, name: str, payload: Any = None) -> None:
        """Send signal ``name`` with a JSON ``payload`` to the run.

        Kept until the run waits for it (``ctx.wait_for_signal(name)``); each is consumed
        once. Unknown run: RunNotFound; a run that ended: InvalidRunState.
        """
        if not isinstance(name, str) or not name:
            raise InvalidParams("a signal name must be a non-empty string")
        storable_text(name, "signal name")
        text = encode(payload, what=f"payload of signal {name!r}")
        signals = signals_of(self._store, "sending a signal")
        await signals.send_signal(self.run_id, name, text)

    async def forget(self) -> bool:
        """Delete the ended run and its journal from the store (False if already gone)."""
        return await history_of(self._store, "forgetting a run").delete_run(self.run_id)

    async def cancel(self) -> RunRecord:
        """Ask the run to stop at its next step boundary (a queued run stops at once)."""
        return await self._store.cancel_run(self.run_id)

    async def terminate(self) -> RunRecord:
        """End the run now. A step already running may finish its effects; its result is
        discarded, and its worker can write nothing more for this run."""
        return await self._store.terminate_run(self.run_id)

    async def retry(self) -> RunRecord:
        """Continue a failed, cancelled, terminated or dead run: finished steps replay,
        the failed one runs again. A child run whose failure (or cancellation) ended the
        run is retried first, recursively, and the run continues from its new outcome."""
        return await retry_run(self._store, self.run_id)


def outcome_of(run: RunRecord) -> Any:
    """The result of a run, or the exception that stands for how it ended."""
    if run.status is RunStatus.COMPLETED:
        return decode(run.result) if run.result is not None else None
    if run.status in (RunStatus.FAILED, RunStatus.DEAD):
        info = ErrorInfo.from_json(run.error or "{}")
        raise DurableInvocationError(
            f"run {run.run_id!r} of {run.workflow!r} {run.status.value}: "
            f"{info.qualified_type}: {info.message}",
            error_type=info.qualified_type,
            error_message=info.message,
            remote_traceback=info.traceback,
            original=info.rebuild() if info.exception_class() is not None else None,
        )
    if run.status in (RunStatus.CANCELLED, RunStatus.TERMINATED):
        raise RunCancelled(f"run {run.run_id!r} was {run.status.value}", run.status.value)
    raise ResultTimeout(f"run {run.run_id!r} is still {run.status.value}")


class WorkflowClient:
    """Submits runs and looks them up. Async; see :mod:`pyrula.workflows.sync` for blocking.

    ``require_registered`` (default True) makes ``submit`` refuse names this process has
    not registered, and check params against the function's signature. Set it False in a
    process that submits by name only; the worker then checks params when it runs.
    """

    def __init__(
        self,
        store: Store,
        *,
        registry: Registry | None = None,
        require_registered: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self.store = store
        self._registry = registry or default_registry
        self._require_registered = require_registered
        self._max_payload = max_payload_bytes
        self._fits: dict[tuple[Any, ...], WorkflowDefinition] = {}

    async def submit(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None = None,
        *,
        owner: str | None = None,
        delay: Delay | None = None,
        start_at: datetime | float | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        expires_at: datetime | float | None = None,
        fresh_id: bool = False,
        keep_key_order: bool = False,
    ) -> RunHandle:
        """Queue a run of ``workflow`` with ``params``; return its handle.

        ``run_id`` chooses the run's id (default: a random one); a taken id raises
        InvalidRunState unless the same ``idempotency_key`` maps to it. ``fresh_id=True``
        says ``run_id`` was just made up at random by the caller (a uuid4), so no earlier
        run can hold it: a store may skip looking for one (an ArchivingStore's archive
        lookup). A run still queued at ``expires_at`` is never started (it ends cancelled
        with ``RunExpired``). Params are stored with their keys sorted, so the same params
        in another key order are the same request; ``keep_key_order=True`` keeps the order
        given, dicts inside included (the Celery drop-in's: a task receives its dicts as
        they were sent), and the same params in another order are then other params.

        ``delay`` (seconds or timedelta) or ``start_at`` (aware datetime) hold the run back.
        A repeated ``idempotency_key`` returns the first run; the same key with other
        params raises IdempotencyConflict. Params are checked (JSON, size, signature)
        here, before anything is stored.
        """
        new = self.new_run(
            workflow,
            params,
            owner=owner,
            delay=delay,
            start_at=start_at,
            idempotency_key=idempotency_key,
            run_id=run_id,
            expires_at=expires_at,
            fresh_id=fresh_id,
            keep_key_order=keep_key_order,
        )
        record, _ = await self.store.create_run(new)
        return RunHandle(self.store, record.workflow, record.run_id)

    def new_run(
        self,
        workflow: str | WorkflowDefinition,
        params: Mapping[str, Any] | None = None,
        *,
        owner: str | None = None,
        delay: Delay | None = None,
        start_at: datetime | float | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        expires_at: datetime | float | None = None,
        fresh_id: bool = False,
        keep_key_order: bool = False,
    ) -> NewRun:
        """The run ``submit`` would create, checked, without storing it (the blocking
        client checks in the calling thread, then stores it by the fastest way)."""
        name = workflow.name if isinstance(workflow, WorkflowDefinition) else workflow
        params = {} if params is None else params
        if not isinstance(params, Mapping):
            raise InvalidParams(f"params must be a mapping of name to value, got {params!r}")
        definition = self._registry.find(name) if isinstance(workflow, str) else workflow
        if definition is None and self._require_registered:
            self._registry.get(name)  # raises UnknownWorkflow with the registered names
        text = encode(
            dict(params), what="params", max_bytes=self._max_payload, canonical=not keep_key_order
        )
        if definition is not None:
            self._check_params(definition, params)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key
        ):
            raise InvalidParams("idempotency_key must be a non-empty string")
        if owner is not None and not isinstance(owner, str):
            raise InvalidParams(f"owner must be a string, got {owner!r}")
        if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
            raise InvalidParams(f"run_id must be a non-empty string, got {run_id!r}")
        for what, value in (
            ("workflow name", name),
            ("run_id", run_id),
            ("idempotency_key", idempotency_key),
            ("owner", owner),
        ):
            if isinstance(value, str):
                storable_text(value, what)
        new = NewRun(
            run_id=run_id or uuid.uuid4().hex,
            workflow=name,
            params=text,
            owner=owner if owner is not None else DEFAULT_OWNER,
            idempotency_key=idempotency_key,
            delay=0.0 if delay is None else seconds(delay, "delay"),
            start_at=None if start_at is None else epoch(start_at, "start_at"),
            flow=NO_FLOW if definition is None else flow_for(definition, params),
            expires_at=None if expires_at is None else epoch(expires_at, "expires_at"),
            generated_id=run_id is None or fresh_id,
        )
        return new if telemetry.current is None else telemetry.current.submitting(new)

    def _check_params(self, definition: WorkflowDefinition, params: Mapping[str, Any]) -> None:
        """``definition.check_params``, once per set of names: params are bound as
        keywords only, so whether they fit depends on their names alone."""
        shape = (id(definition), *params)
        if self._fits.get(shape) is definition:
            return
        definition.check_params(params)
        if len(self._fits) >= 256:
            self._fits.clear()
        self._fits[shape] = definition

    async def send_events(self, trigger: str, events: Iterable[Any]) -> list[int]:
        """Append ``events`` (JSON values) to the buffer of the batch trigger ``trigger``,
        in order, as one atomic write; return their sequence numbers. Every value is
        checked (JSON, size) before anything is stored. See
        :mod:`pyrula.workflows.triggers`."""
        events_store = events_of(self.store, "sending events")
        return await events_store.append_events(*self.event_texts(trigger, events))

    async def send_event(self, trigger: str, event: Any) -> int:
        """Append one event to the buffer of ``trigger``; return its sequence number."""
        return (await self.send_events(trigger, [event]))[0]

    def event_texts(self, trigger: str, events: Iterable[Any]) -> tuple[str, list[str]]:
        """``(trigger, [event as JSON text, ...])``, checked, for ``Store.append_events``."""
        try:
            check_name(trigger)
        except ConfigurationError as exc:
            raise InvalidParams(str(exc)) from None
        if isinstance(events, (str, bytes, Mapping)):
            raise InvalidParams(
                f"events must be a list of JSON values, got {type(events).__name__}; "
                "send one event with send_event"
            )
        limit = self._max_payload - PARAMS_OVERHEAD
        texts = [
            encode(value, what=f"event {i} of trigger {trigger!r}", max_bytes=limit, canonical=True)
            for i, value in enumerate(events)
        ]
        return trigger, texts

    def handle(self, workflow: str, run_id: str) -> RunHandle:
        """A handle on an existing run."""
        return RunHandle(self.store, workflow, run_id)

    async def purge_queued(self, workflows: Iterable[str]) -> int:
        """Cancel every run of ``workflows`` that waits to start (queued, never started:
        due or delayed); return how many. Started runs are left alone. See
        :func:`pyrula.workflows.purging.purge_queued`."""
        return await purging.purge_queued(self.store, workflows)

    async def close(self) -> None:
        """Close the store."""
        await self.store.close()
