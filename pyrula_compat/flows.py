"""The workflows behind tasks and chords, and submitting a signature from anywhere.

A task ``proj.tasks.add`` is a workflow of that name whose params are
``{"args": [...], "kwargs": {...}}`` plus optional canvas data (``chain``, ``link``,
``link_error``, ``headers``, ``parent_id``/``root_id``, ``failed``). Each attempt of the
body is its own journaled step (``attempt-0``, ``attempt-1``, ...): a success is its
value, a failure and a retry are failed steps carrying the exception
(:mod:`pyrula_compat.outcomes`), so a retry's countdown, arguments and count survive a
crash, and ``pyrula runs retry`` runs a failed task's body again; the wait between
attempts is a durable ``ctx.sleep`` (the run reads ``RETRY`` meanwhile). Follow-ups (the
next chain step, links, errbacks) are submitted with the ids fixed when the canvas was
called, so a replay submits nothing twice: after a success, inside the attempt's own
step, before its outcome is journaled (``"followed": true``; a replay re-runs the body
only if the worker died before that journal write, as it would anyway), and if that
submission fails, in one more journaled step; after a failure, inside the attempt's
step too (tried again on a store error, then logged). A callback or errback that raises
is logged and never changes the task's own outcome (a new-style errback runs once per
failure; only a worker crash re-runs it). An attempt that called ``self.replace(sig)``
journals ``sig``; the run then runs it as child runs and ends as it ends
(:mod:`pyrula_compat.replace`). Each attempt logs Celery's worker lines
(:mod:`pyrula_compat.worker_log`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from pyrula.workflows import (
    RetryPolicy,
    Step,
    StepContext,
    WorkflowContext,
    WorkflowDefinition,
    log_context,
    workflow,
)
from pyrula.workflows.engine.control import CancelRequested, LeaseGone
from pyrula.workflows.registry import Registry
from pyrula_compat import (
    codec,
    errors,
    outcomes,
    replace,
    states,
    trail,
    worker_log,
    worker_signals,
)
from pyrula_compat.app.task import Context
from pyrula_compat.calling import ORIGIN, TIMES, aware, eta_datetime
from pyrula_compat.canvas import GENERATED_ID
from pyrula_compat.execution import Attempt, run_attempt
from pyrula_compat.runstate import EXPIRED_INFO

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

log = logging.getLogger("pyrula_compat.worker")

ONE_ATTEMPT = RetryPolicy(max_attempts=1)
"""Attempt steps never retry by themselves: the task's own retry rules decide."""
NOT_CUSTOM = (*TIMES, ORIGIN)
"""Headers that are request fields of their own, not ``request.headers``."""


# -- the task workflow -------------------------------------------------------------------
def _attempt_step(
    step_ctx: StepContext,
    app: Celery,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any],
    retries: int,
    meta: dict[str, Any],
) -> dict[str, Any]:
    if retries and _expired(step_ctx, app, meta):  # a retry carries the task's expiry
        meta["_expired"] = True
        return {"kind": "expired"}
    # In the step's own copy of the context: what the attempt logs names the task.
    log_context.bind(task=name, task_id=step_ctx.run_id)
    task = app.tasks[name]
    chain = meta.get("chain")
    headers = {k: v for k, v in meta["_headers"].items() if k not in NOT_CUSTOM}
    request = Context(
        id=step_ctx.run_id, args=codec.from_json(args), kwargs=codec.from_json(kwargs),
        retries=retries, is_eager=False, called_directly=False, hostname=hostname(),
        root_id=meta.get("root_id") or step_ctx.run_id, parent_id=meta.get("parent_id"),
        group=meta.get("group_id"), group_index=meta.get("group_index"),
        chain=list(reversed(chain)) if chain else None, callbacks=meta.get("link"),
        errbacks=meta.get("link_error"), headers=headers, timelimit=headers.get("timelimit"),
        periodic_task_name=headers.get("periodic_task_name"),
        replaced_task_nesting=headers.get("replaced_task_nesting", 0),
        delivery_info={"exchange": "", "routing_key": "celery", "priority": None,
                       "redelivered": step_ctx.attempt > 1},
        task=name, correlation_id=step_ctx.run_id, reply_to=None,
        origin=meta["_headers"].get(ORIGIN), shadow=headers.get("shadow"),
        eta=meta.get("eta"), expires=meta.get("expires"),
    )  # fmt: skip
    request._step = step_ctx
    request._chain_given = bool(chain)  # type: ignore[attr-defined]
    if task.track_started:  # Celery's task_track_started: STARTED while it runs
        step_ctx.set_progress(states.STARTED, None)
    worker_log.received(name, request)
    worker_signals.received(task, request)
    started = time.monotonic()
    attempt = run_attempt(task, request, meta["_guards"])
    worker_log.ended(task, request, attempt, time.monotonic() - started)
    if attempt.kind == "error" and (meta.get("link_error") or chain):
        _errbacks(app, name, step_ctx, attempt, meta, args, kwargs)
    outcome = outcomes.journal(attempt, name, step_ctx)  # raises a failure or a retry
    rest = None if outcome.get("chain_stopped") else chain
    succeeded = outcome["kind"] == "ok"
    children = trail.outcome_children(
        request, meta.get("link") if succeeded else None, rest if succeeded else None
    )
    if children:  # AsyncResult.children: what it sent, as Celery stores with the result
        outcome["children"] = children
    if succeeded and (meta.get("link") or rest):
        try:
            _after_success(
                app, step_ctx.run_id, outcome["value"], meta.get("link"), rest,
                meta.get("root_id") or step_ctx.run_id,
            )  # fmt: skip
        except Exception as exc:  # the workflow submits them in a step of their own
            log.warning("task %s[%s]: follow-ups not queued yet: %r", name, step_ctx.run_id, exc)
        else:
            outcome["followed"] = True
    return outcome


def make_task_workflow(app: Celery, name: str, registry: Registry, rate: Any) -> WorkflowDefinition:
    """The workflow that runs task ``name`` of ``app``."""

    async def celery_task(
        ctx: WorkflowContext,
        args: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
        chain: list[dict[str, Any]] | None = None,
        link: list[dict[str, Any]] | None = None,
        link_error: list[dict[str, Any]] | None = None,
        headers: dict[str, Any] | None = None,
        root_id: str | None = None,
        parent_id: str | None = None,
        group_id: str | None = None,
        group_index: int | None = None,
        failed: str | None = None,
        expires_in: float | None = None,
        retries: int | None = None,
    ) -> Any:
        guards: dict[str, Any] = {}  # the running attempt's BodyGuard (run_attempt)
        meta = {
            "chain": chain, "link": link, "link_error": link_error, "headers": headers,
            "root_id": root_id, "parent_id": parent_id, "group_id": group_id,
            "group_index": group_index, "eta": (headers or {}).get("eta"),
            "expires": (headers or {}).get("expires"), "expires_in": expires_in,
            "_guards": guards,
            "_headers": codec.from_json(headers) or {},  # decoded once for every attempt
        }  # fmt: skip
        if failed is not None:  # a chain or chord step whose predecessor failed
            exc, tb = errors.from_json(failed)
            raise errors.with_remote_traceback(exc, tb)
        try:
            return await run_task(ctx, meta, args, kwargs, expires_in, retries or 0)
        except CancelRequested:  # revoked (or expired) and noticed here: Celery's signal
            worker_signals.revoked(app, name, ctx.run_id, meta, expired=bool(meta.get("_expired")))
            raise
        except (LeaseGone, asyncio.CancelledError):
            if worker_signals.lease_lost(ctx):  # terminated, or taken over after a stall
                guards["stop"] = True  # an attempt not in its body yet stops on entry
                body = guards.get("body")
                if body is not None:  # in its body, in its thread: stop it there
                    body.stop_body()
                await worker_signals.revoked_if_terminated(app, name, ctx.run_id, meta)
            raise

    async def run_task(
        ctx: WorkflowContext,
        meta: dict[str, Any],
        args: list[Any] | None,
        kwargs: dict[str, Any] | None,
        expires_in: float | None,
        retries: int,
    ) -> Any:
        """``retries``: the attempts made before this run (a task adopted from Celery
        mid-retry), so ``request.retries`` and ``max_retries`` carry on from there."""
        chain, link = meta["chain"], meta["link"]
        root_id = meta["root_id"]
        if expires_in is not None and await Step(_expire_if_late, name="expiry")(
            app, ctx.run_id, expires_in
        ):
            meta["_expired"] = True
            await ctx.step("expired", _noop)  # the cancel takes effect at this boundary
        task = app.tasks[name]
        call_args, call_kwargs = list(args or []), dict(kwargs or {})
        call_limits = meta["_headers"].get("timelimit") or [None, None]
        hard = call_limits[0] if call_limits[0] is not None else task.time_limit
        while True:
            attempt = Step(
                _attempt_step, name=f"attempt-{retries}", retry=ONE_ATTEMPT,
                timeout=hard or None,
            )  # fmt: skip
            try:
                outcome = await attempt(app, name, call_args, call_kwargs, retries, meta)
            except outcomes.RetryScheduled as scheduled:  # journaled failed: see outcomes
                outcome = {"kind": "retry", **scheduled.decision}
            if outcome["kind"] == "expired":  # _attempt_step cancelled the run
                meta["_expired"] = True
                await ctx.step(f"expired-{retries}", _noop)  # the cancel takes effect here
                raise CancelRequested()
            if outcome["kind"] != "retry":
                break
            if outcome.get("eta") is not None:
                when = datetime.fromtimestamp(outcome["eta"], UTC)
                await ctx.sleep_until(when, name=f"retry-{retries}")
            else:
                await ctx.sleep(outcome.get("countdown") or 0.0, name=f"retry-{retries}")
            call_args = outcome.get("args", call_args)
            call_kwargs = outcome.get("kwargs", call_kwargs)
            meta["eta"] = outcome.get("retry_eta")  # the retried attempt's request.eta
            retries += 1
        # A failure journaled by the attempt step raised out of `await attempt(...)`
        # above, and ends the run here: the same exception, so that the run records the
        # attempt as the step that failed it and `pyrula runs retry` runs it again.
        if outcome["kind"] == "replace":  # self.replace(sig): sig's result is ours
            outcome = await replace.follow(ctx, app, outcome, root_id or ctx.run_id)
        if outcome["kind"] == "ok":
            rest = None if outcome.get("chain_stopped") else chain
            if (link or rest) and not outcome.get("followed"):
                try:
                    await ctx.step(
                        "callbacks", _after_success, app, ctx.run_id, outcome["value"], link,
                        rest, root_id or ctx.run_id,
                    )  # fmt: skip
                except Exception as error:  # the task succeeded all the same, as in Celery
                    log.error("task %s[%s]: callbacks not queued: %r", name, ctx.run_id, error)
            return outcome["value"]
        return await _legacy_failure(ctx, app, name, outcome, meta, call_args, call_kwargs)

    definition: WorkflowDefinition = workflow(
        name=name,
        registry=registry,
        rate_limit=rate,
        on_expired=worker_signals.expired_hook(app, name),  # task_revoked(expired=True)
    )(celery_task)
    return definition


def hostname() -> str:
    """``request.hostname``: the node name of the worker serving here (``pyrula worker
    -n``, by default Celery's ``celery@<host>``)."""
    consumer = worker_signals.consumer
    name = getattr(consumer, "hostname", None) if consumer is not None else None
    return name or f"celery@{socket.gethostname()}"


def _expire_if_late(step_ctx: StepContext, app: Celery, run_id: str, expires_in: float) -> bool:
    """Revoke this run, as expired, if it started more than ``expires_in`` seconds after
    it was created (a beat entry's ``expires`` option)."""
    handle = app.client().handle("", run_id)
    record = handle.record()
    if (record.started_at or time.time()) - record.created_at <= expires_in:
        return False
    step_ctx.set_progress(states.REVOKED, EXPIRED_INFO)
    handle.cancel()
    return True


def _expired(step_ctx: StepContext, app: Celery, meta: dict[str, Any]) -> bool:
    """Before a retry: revoke the run, as expired, if the task's expiry has passed (the
    ``expires`` it was sent with, or a beat entry's ``expires`` counted from its
    creation), as Celery's worker discards a retry that arrives after it."""
    expires, expires_in = meta.get("expires"), meta.get("expires_in")
    if expires is None and expires_in is None:
        return False
    handle = app.client().handle("", step_ctx.run_id)
    if expires is not None:
        deadline = aware(datetime.fromisoformat(expires)).timestamp()
    else:
        deadline = handle.record().created_at + float(expires_in or 0)
    if time.time() < deadline:
        return False
    step_ctx.set_progress(states.REVOKED, EXPIRED_INFO)
    handle.cancel()
    return True


def _noop() -> None:
    return None


ERRBACK_WAITS = (1.0, 2.0)
"""Seconds between the tries of a failed task's errbacks when the store fails."""


def _errbacks(
    app: Celery,
    name: str,
    step_ctx: StepContext,
    attempt: Attempt,
    meta: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
) -> None:
    """After a task failed for good, in its attempt's step before the failure is
    journaled (so a retry of the run that runs the body again journals no stale step
    after it): :func:`_after_failure`. A store error is tried again after each of
    :data:`ERRBACK_WAITS`, then logged: the task's own failure stands, as in Celery."""
    assert attempt.exc is not None
    error = errors.to_json(attempt.exc)
    link_error, chain = meta.get("link_error"), meta.get("chain")
    for wait in (*ERRBACK_WAITS, None):
        try:
            _after_failure(step_ctx, app, name, error, link_error, chain, args, kwargs)
            return
        except Exception as exc:
            if wait is None:
                log.error("task %s[%s]: errbacks not queued: %r", name, step_ctx.run_id, exc)
                return
            log.warning(
                "task %s[%s]: errbacks not queued (%r); trying again in %.0fs",
                name, step_ctx.run_id, exc, wait,
            )  # fmt: skip
            time.sleep(wait)


async def _legacy_failure(
    ctx: WorkflowContext,
    app: Celery,
    name: str,
    outcome: dict[str, Any],
    meta: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
) -> NoReturn:
    """Replay an attempt journaled as an ``error`` value (see :mod:`outcomes`): the
    ``errbacks`` step that followed it then, and the failure."""
    link_error, chain = meta.get("link_error"), meta.get("chain")
    if link_error or chain:
        try:
            await Step(_after_failure, name="errbacks")(
                app, name, outcome["error"], link_error, chain, args, kwargs
            )
        except Exception as error:  # the task's own failure stands, as in Celery
            log.error("task %s[%s]: errbacks not queued: %r", name, ctx.run_id, error)
    exc, tb = errors.from_json(outcome["error"])
    raise errors.with_remote_traceback(exc, tb)


def _after_success(
    app: Celery,
    run_id: str,
    value: Any,
    link: list[dict[str, Any]] | None,
    chain: list[dict[str, Any]] | None,
    root_id: str,
) -> None:
    result = codec.from_json(value)
    extra = {"parent_id": run_id, "root_id": root_id}
    for sig in link or ():
        submit_signature(app, sig, [result], {}, extra=extra)
    if chain:
        submit_signature(app, chain[0], [result], {}, chain=chain[1:], extra=extra)


def _after_failure(
    step_ctx: StepContext,
    app: Celery,
    name: str,
    error: str,
    link_error: list[dict[str, Any]] | None,
    chain: list[dict[str, Any]] | None,
    args: list[Any],
    kwargs: dict[str, Any],
) -> None:
    """Show the task as FAILURE (Celery stores it before calling errbacks), queue the
    old-style errbacks and mark the rest of the chain failed (store writes, safe to
    repeat: a store error here retries the step), then call the new-style errbacks,
    last, so that they run once: one that raises is logged, as Celery's worker logs it,
    and changes nothing."""
    from pyrula_compat.canvas import Signature

    run_id = step_ctx.run_id
    step_ctx.set_progress(states.FAILURE, {"error": error})
    exc, tb = errors.from_json(error)
    request = Context(
        id=run_id, task=name, args=codec.from_json(args), kwargs=codec.from_json(kwargs),
        called_directly=False,
    )  # fmt: skip
    inline = []
    for data in link_error or ():
        sig = Signature.from_dict(data, app)
        task = app.tasks.get(sig.task)
        if task is not None and _arity(task) > 1:  # new style: (request, exc, traceback)
            inline.append(sig)
        else:  # old style: queued with the failed task's id
            submit_signature(app, data, [run_id], {})
    for data in chain or ():
        mark_failed(app, data, error)
    for sig in inline:
        try:
            sig(request, exc, tb)
        except Exception:
            log.exception("task %s[%s]: errback %s raised", name, run_id, sig.task)


def _arity(task: Any) -> int:
    import inspect

    try:
        params = inspect.signature(task.run).parameters.values()
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return 3
    return sum(1 for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def mark_failed(app: Celery, data: dict[str, Any], error: str) -> None:
    """Record a never-run step of a failed chain as failed with the same error."""
    kind = data.get("subtask_type")
    kw = data.get("kwargs") or {}
    if kind == "chord":
        if kw.get("body"):
            mark_failed(app, kw["body"], error)
        return
    if kind in ("group", "chain"):
        for member in kw.get("tasks") or []:
            mark_failed(app, member, error)
        return
    task_id = (data.get("options") or {}).get("task_id")
    _submit_task(app, data, [], {}, extra={"failed": error}, task_id=task_id)


# -- submitting any signature --------------------------------------------------------------
def _submit_task(
    app: Celery,
    data: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    extra: dict[str, Any] | None = None,
    task_id: str | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    from pyrula_compat import calling

    opts = {**(codec.from_json(data.get("options") or {})), **(options or {})}
    link, link_error = opts.pop("link", None), opts.pop("link_error", None)
    run_id = task_id or opts.pop("task_id", None)
    generated = opts.pop(GENERATED_ID, None)
    if data.get("immutable"):
        call_args, call_kwargs = list(data.get("args") or []), dict(data.get("kwargs") or {})
    else:
        call_args = list(args) + list(data.get("args") or [])
        call_kwargs = {**dict(data.get("kwargs") or {}), **kwargs}
    calling.submit(
        app, data["task"], codec.from_json(call_args), codec.from_json(call_kwargs),
        task_id=run_id, link=link, link_error=link_error, options=opts, extra=extra,
        keyed=run_id is None or generated != run_id,
    )  # fmt: skip


def submit_signature(
    app: Celery,
    data: dict[str, Any],
    args: list[Any],
    kwargs: dict[str, Any],
    *,
    chain: list[dict[str, Any]] | None = None,
    options: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Queue a frozen signature (task, group or chord) with ``args`` prepended; ``chain``
    is what follows it."""
    kind = data.get("subtask_type")
    kw = data.get("kwargs") or {}
    if kind == "chain":
        steps = list(kw.get("tasks") or [])
        if steps:
            rest = steps[1:] + list(chain or [])
            submit_signature(app, steps[0], args, kwargs, chain=rest, options=options, extra=extra)
        return
    if kind == "group":
        group_id = (data.get("options") or {}).get("task_id")
        for index, member in enumerate(kw.get("tasks") or []):
            member_extra = {**(extra or {}), "group_id": group_id, "group_index": index}
            submit_signature(app, member, args, kwargs, options=options, extra=member_extra)
        return
    if kind == "chord":
        _submit_chord(app, data, args, chain, options)
        return
    _submit_task(app, data, args, kwargs, extra={**(extra or {}), "chain": chain or None},
                 options=options)  # fmt: skip


def _submit_chord(
    app: Celery,
    data: dict[str, Any],
    args: list[Any],
    chain: list[dict[str, Any]] | None,
    options: dict[str, Any] | None = None,
) -> None:
    """The chord's run; ``countdown``/``eta`` hold it back (the header, then the body)."""
    kw = data.get("kwargs") or {}
    header = (kw.get("header") or {}).get("kwargs", {}).get("tasks", [])
    chord_id = (data.get("options") or {}).get("task_id")
    params = {"header": header, "body": kw["body"], "args": codec.to_json(list(args))}
    if chain:
        params["chain"] = chain
    countdown = (options or {}).get("countdown")
    delay = None if countdown is None else max(0.0, float(countdown))
    start_at = eta_datetime((options or {}).get("eta")) if countdown is None else None
    app.client().submit(
        "celery.chord", params, run_id=chord_id, idempotency_key=chord_id, delay=delay,
        start_at=start_at,
    )  # fmt: skip
