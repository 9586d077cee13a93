"""``Task.replace(sig)``: the rest of a task is ``sig``, durably.

In the body, ``self.replace(sig)`` raises :class:`Replaced` (an ``Ignore``, as Celery
raises), so no code after it runs. On a worker the attempt's journaled outcome is
``{"kind": "replace", "sig": ...}``: a replay never runs the body again. The task's run
then runs ``sig`` as child runs of itself (a task is one child run; a chain runs its
links one child after another, each with the previous result; a group gathers its
members; a chord gathers its header and then runs its body) and takes the last result
as its own. Starting a child is journaled with the child in one store call, so a worker
that dies anywhere here never starts the replacement twice: the next worker finds the
child in the journal and waits for it. The task's chain and links continue from its run
with the replacement's result; a failing replacement fails the task with its error.
A task of the replacement with an id of its own (Celery runs it under that id) has its
outcome recorded under that id too once it ends. The built-in ``celery.chunks`` task
uses the same path: its run gathers its chunk tasks (:func:`run_chunks`).

In eager mode the replacement runs here (``sig.apply().get()``) and its result is the
task's result.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from pyrula.workflows import (
    DurableInvocationError,
    RunCancelled,
    WorkflowContext,
    WorkflowDefinition,
    workflow,
)
from pyrula.workflows.errors import IdempotencyConflict, InvalidRunState
from pyrula.workflows.registry import Registry
from pyrula.workflows.serialization import ErrorInfo
from pyrula_compat import codec, errors
from pyrula_compat.exceptions import ChordError, Ignore, ImproperlyConfigured, TaskRevokedError

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.app.task import Task

RUNNER = "celery.replaced"
"""The internal workflow that runs a group, chain or chord member of a replacement."""
CHUNKS = "celery.chunks"
ACCUMULATE = "celery.accumulate"
log = logging.getLogger("pyrula_compat.worker")


class _Failed(Exception):
    """A part of the replacement failed with ``error`` (its own exception)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(repr(error))
        self.error = error


class Replaced(Ignore):
    """Raised by ``Task.replace``: the body stops here. On a worker it carries the
    replacement (``sig``, JSON); in eager mode its result (``value``)."""

    def __init__(
        self,
        sig: dict[str, Any] | None = None,
        *,
        value: Any = None,
        eager: bool = False,
        chain_stopped: bool = False,
        nesting: int = 1,
    ) -> None:
        super().__init__("Replaced by new task")
        self.sig = sig
        self.value = value
        self.eager = eager
        self.chain_stopped = chain_stopped
        self.nesting = nesting


# -- in the body --------------------------------------------------------------------------
def replace(task: Task, sig: Any) -> Any:
    """``Task.replace``: check ``sig`` as Celery does, then ``task.on_replace(sig)``."""
    from pyrula_compat.canvas import maybe_signature
    from pyrula_compat.primitives import _chain

    replacement = maybe_signature(sig, app=task.app)
    if replacement is None:
        raise TypeError("Task.replace needs a signature")
    if isinstance(replacement, _chain) and replacement.tasks:  # its chunks as groups
        replacement = _chain(*replacement.steps(), app=task.app, **replacement.options)
    if "chord" in replacement.options:
        raise ImproperlyConfigured("A signature replacing a task must not be part of a chord")
    if isinstance(replacement, _chain) and not replacement.tasks:
        raise ImproperlyConfigured("Cannot replace with an empty chain")
    return task.on_replace(replacement)


def on_replace(task: Task, sig: Any) -> Any:
    """Run ``sig`` in the task's place: here in eager mode, as the run's children on a
    worker; called directly (no worker, not eager) it is queued, as Celery does."""
    request = task.request
    nesting = int(request.get("replaced_task_nesting") or 0) + 1
    if request.is_eager:
        raise Replaced(value=sig.apply().get(), eager=True)
    if request.called_directly or request._step is None:
        sig.delay()
        raise Ignore("Replaced by new task")
    stopped = request.chain is None and bool(getattr(request, "_chain_given", False))
    _freeze_callbacks(sig)
    raise Replaced(sig.as_json(), chain_stopped=stopped, nesting=nesting)


def run_chunks(task: Task, sig: Any, it: list[Any], n: int) -> Any:
    """The body of the built-in ``celery.chunks`` task (a ``chunks`` sent by name, or a
    member of a group, chain or chord header): Celery's ``chunks.apply_chunks``. On a
    worker the run gathers the chunk tasks as its child runs, as a replacement does, and
    its result is what the chunks' ``GroupResult.get()`` gives (one list per chunk;
    the first failed chunk's own error). Eagerly the chunks run here; called directly
    the group is queued and its ``GroupResult`` returned, as in Celery."""
    from pyrula_compat.primitives import chunks

    made = chunks(sig, it, n, app=task.app)
    request = task.request
    if request.is_eager:
        return made.group().apply().get()
    if request.called_directly or request._step is None:
        return made.apply_async()
    raise Replaced(made.as_json(), nesting=int(request.get("replaced_task_nesting") or 0))


def _freeze_callbacks(sig: Any) -> None:
    """Fix the ids of every link and errback in ``sig`` now, inside the journaled
    attempt, so the children started from it are the same on every replay."""
    from pyrula_compat.canvas import Signature

    if not isinstance(sig, Signature):
        return
    for key in ("link", "link_error"):
        value = sig.options.get(key)
        for callback in value if isinstance(value, list) else [value]:
            if isinstance(callback, Signature):
                callback.freeze()
    kw = sig.get("kwargs") or {}
    for member in [*(kw.get("tasks") or []), kw.get("header"), kw.get("body")]:
        _freeze_callbacks(member)


# -- in the task's run ------------------------------------------------------------------------
async def follow(
    ctx: WorkflowContext, app: Celery, outcome: dict[str, Any], root_id: str
) -> dict[str, Any]:
    """Run the replacement of a ``replace`` outcome; the task's outcome in its place."""
    meta = {"nesting": outcome.get("nesting") or 1, "root_id": root_id, "parent_id": ctx.run_id}
    try:
        value = await run_signature(ctx, app, outcome["sig"], [], meta)
    except _Failed as failed:
        return {"kind": "error", "error": errors.to_json(failed.error)}
    return {"kind": "ok", "value": value, "chain_stopped": outcome.get("chain_stopped", False)}


async def run_signature(
    ctx: WorkflowContext, app: Celery, data: dict[str, Any], args: list[Any], meta: dict[str, Any]
) -> Any:
    """Run the signature ``data`` (with ``args``, JSON) as child runs of ``ctx``'s run;
    return its result (JSON). A failure raises :class:`_Failed` with the failing task's
    own error."""
    kind = data.get("subtask_type")
    kw = data.get("kwargs") or {}
    if kind == "chain":
        value: Any = None
        call_args = args
        for member in _chain_steps(kw.get("tasks") or []):
            value = await run_signature(ctx, app, member, call_args, meta)
            call_args = [value]
        return value
    if kind == "group":
        return await _run_group(ctx, app, kw.get("tasks") or [], args, meta)
    if kind == "chord":
        header = (kw.get("header") or {}).get("kwargs", {}).get("tasks", [])
        values = await _run_group(ctx, app, header, args, meta)
        return await run_signature(ctx, app, kw["body"], [values], meta)
    if kind is None and data.get("task") == CHUNKS:  # what its GroupResult.get() gives
        from pyrula_compat.primitives import chunks

        made = chunks.from_dict(data, app)
        assert isinstance(made, chunks)
        parts = made.group().as_json()["kwargs"]["tasks"]
        return await _run_group(ctx, app, parts, [], meta, own_errors=True)
    try:
        value = await _child(ctx, app, data, args, meta)
    except _CHILD_ERRORS as exc:
        error = _original(exc)
        await _record_own_id(ctx, app, data, meta, None, error)
        raise _Failed(error) from None
    await _record_own_id(ctx, app, data, meta, value, None)
    return value


def _chain_steps(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chain's links; nested chains flattened (a group then a task is a chord: the
    task gets the group's list, as running them in turn gives)."""
    out: list[dict[str, Any]] = []
    for member in tasks:
        if member.get("subtask_type") == "chain":
            out.extend(_chain_steps((member.get("kwargs") or {}).get("tasks") or []))
        else:
            out.append(member)
    return out


async def _run_group(
    ctx: WorkflowContext,
    app: Celery,
    members: list[dict[str, Any]],
    args: list[Any],
    meta: dict[str, Any],
    own_errors: bool = False,
) -> list[Any]:
    """Every member at once; their results in order. A member's failure fails the group
    with ``ChordError``, as the body of Celery's chord (a replacing group is one) fails;
    with ``own_errors`` (a ``chunks``) with the first failed member's own error, as
    ``GroupResult.get()`` raises. No members: ``[]``, as Celery's chord calls its body
    with."""
    if not members:
        return []
    runs = [_child(ctx, app, member, args, meta) for member in members]
    results = await ctx.gather(*runs, return_exceptions=True)
    for member, value in zip(members, results, strict=True):
        if not isinstance(value, BaseException):
            await _record_own_id(ctx, app, member, meta, value, None)
        elif isinstance(value, _CHILD_ERRORS):
            await _record_own_id(ctx, app, member, meta, None, _original(value))
    for member, value in zip(members, results, strict=True):
        if isinstance(value, BaseException):
            if not isinstance(value, _CHILD_ERRORS):
                raise value
            if own_errors:
                raise _Failed(_original(value))
            name = member.get("task") or member.get("subtask_type")
            raise _Failed(ChordError(f"Dependency {name} raised {_original(value)!r}"))
    return list(results)


def _child(
    ctx: WorkflowContext,
    app: Celery,
    data: dict[str, Any],
    args: list[Any],
    meta: dict[str, Any],
) -> Awaitable[Any]:
    """One child run for ``data``: the task's own run, or a :data:`RUNNER` run."""
    if data.get("subtask_type") in ("chain", "group", "chord"):
        return ctx.run_child(RUNNER, {"sig": data, "args": args, "meta": meta})
    from pyrula_compat import calling

    opts = codec.from_json(data.get("options") or {})
    given = list(data.get("args") or [])
    call_args = given if data.get("immutable") else list(args) + given
    headers = {**(opts.get("headers") or {}), "replaced_task_nesting": meta["nesting"]}
    params = calling.task_params(
        codec.from_json(call_args), codec.from_json(data.get("kwargs") or {}), app=app,
        link=opts.get("link"), link_error=opts.get("link_error"), headers=headers,
        extra={"root_id": meta.get("root_id"), "parent_id": meta.get("parent_id")},
    )  # fmt: skip
    return ctx.run_child(data["task"], params)


_CHILD_ERRORS = (DurableInvocationError, RunCancelled)


async def _record_own_id(
    ctx: WorkflowContext,
    app: Celery,
    data: dict[str, Any],
    meta: dict[str, Any],
    value: Any,
    error: BaseException | None,
) -> None:
    """A task of the replacement given its own id (``.set(task_id=...)``, or frozen
    before ``replace``) runs under that id in Celery, which freezes the replacement with
    the replaced task's id only when it has none. Here it runs as a child run of the
    replaced task's; once it ends, its outcome is recorded under its own id too (a
    journaled step), so both ids give its result."""
    if data.get("subtask_type") or data.get("task") == CHUNKS:
        return
    own = (data.get("options") or {}).get("task_id")
    if not own or own == meta.get("parent_id"):
        return
    text = errors.to_json(error) if error is not None else None
    await ctx.step(f"own-id-{own}", _record_under, app, data, own, value, text)


def _record_under(
    app: Celery, data: dict[str, Any], own: str, value: Any, error: str | None
) -> None:
    from pyrula_compat import calling, flows

    try:
        if error is not None:  # the task's own run, failed with that error at once
            flows.mark_failed(app, {**data, "options": {"task_id": own}}, error)
        else:
            args = [codec.from_json(value)]
            calling.submit(app, ACCUMULATE, args, {"index": 0}, task_id=own)
    except (IdempotencyConflict, InvalidRunState) as exc:  # the id was taken before
        log.warning("replacement task id %s already names another run: %r", own, exc)


def _original(exc: BaseException) -> BaseException:
    """The error a child run failed with, as its own class (or a stand-in of its name),
    with its remote traceback; a cancelled child is ``TaskRevokedError``."""
    if isinstance(exc, RunCancelled):
        return TaskRevokedError("revoked")
    if not isinstance(exc, DurableInvocationError):
        return exc
    original = exc.original
    if original is not None:
        module, name = type(original).__module__, type(original).__qualname__
    else:
        module, _, name = exc.error_type.rpartition(".")
    info = ErrorInfo(module or "builtins", name, exc.error_message, exc.remote_traceback)
    return errors.with_remote_traceback(errors.rebuild(info), exc.remote_traceback)


def make_replace_workflow(app: Celery, registry: Registry) -> WorkflowDefinition:
    """:data:`RUNNER`: a chain, group or chord inside a replacement, as one child run."""

    async def replaced(
        ctx: WorkflowContext,
        sig: dict[str, Any],
        args: list[Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Any:
        try:
            return await run_signature(ctx, app, sig, list(args or []), dict(meta or {}))
        except _Failed as failed:
            failed.error.__suppress_context__ = True  # keep its remote traceback (cause)
            raise failed.error  # noqa: B904

    definition: WorkflowDefinition = workflow(name=RUNNER, registry=registry)(replaced)
    return definition
