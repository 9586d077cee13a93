"""The internal workflows of the canvas: ``celery.chord`` and ``celery.chain``.

A chord is one run of ``celery.chord``: it starts each header member as a child run
(ids ``<chord id>.<position>``, known when the chord is called), gathers them, and then
submits the body with the results in header order, in a journaled step. If a member
fails, the body is recorded as failed with ``ChordError`` instead, and the body's errbacks
are called with it (Celery's ``chord_error_from_stack``): no polling task, and nothing
to hang on. ``celery.chain`` runs a chain that is a header member, one child
run after another, so the chord receives the chain's last result; a group or chord
member is one run of ``celery.replaced`` (the list of its results, or its body's).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyrula.workflows import (
    DurableInvocationError,
    RunCancelled,
    WorkflowContext,
    WorkflowDefinition,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula_compat import codec, errors
from pyrula_compat.exceptions import ChordError
from pyrula_compat.flows import _arity, mark_failed, submit_signature

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

log = logging.getLogger("pyrula_compat")


# -- the chord workflow ------------------------------------------------------------------
def _child_params(app: Celery, data: dict[str, Any], args: list[Any]) -> tuple[str, dict[str, Any]]:
    """The child run (workflow, params) for one header member."""
    from pyrula_compat import calling

    if data.get("subtask_type") == "chain":
        return "celery.chain", {"tasks": data["kwargs"]["tasks"], "args": args}
    if data.get("subtask_type") in ("group", "chord"):
        # A nested group gives the list of its results, a nested chord its body's result,
        # as in Celery: one run of the canvas runner, whose children they are.
        from pyrula_compat.replace import RUNNER

        return RUNNER, {"sig": data, "args": args, "meta": {"nesting": 0}}
    opts = codec.from_json(data.get("options") or {})
    immutable = bool(data.get("immutable"))
    call_args = list(data.get("args") or []) if immutable else args + list(data.get("args") or [])
    params = calling.task_params(
        codec.from_json(call_args), codec.from_json(data.get("kwargs") or {}), app=app,
        link=opts.get("link"), link_error=opts.get("link_error"),
    )  # fmt: skip
    return data["task"], params


def _reason(error: BaseException) -> str:
    if isinstance(error, DurableInvocationError):
        original = error.original
        if original is None:
            return f"{error.error_type.rsplit('.', 1)[-1]}({error.error_message!r})"
        return repr(original)
    if isinstance(error, RunCancelled):
        return "TaskRevokedError('revoked')"
    return repr(error)


def fail_body(app: Celery, body: dict[str, Any], error: str) -> None:
    """Record the body of a chord whose header failed as failed with the ChordError,
    then call its errbacks with it, as Celery does: a new-style one here with a request
    for the body, an old-style one queued with the body's id. One that raises is logged."""
    mark_failed(app, body, error)
    for data in _first_tasks(body):
        _call_errbacks(app, data, error)


def _first_tasks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The tasks that would have started first: a chain's first, a group's members."""
    kind, kw = data.get("subtask_type"), data.get("kwargs") or {}
    if kind == "chain":
        steps = kw.get("tasks") or []
        return _first_tasks(steps[0]) if steps else []
    if kind == "group":
        return [task for member in kw.get("tasks") or [] for task in _first_tasks(member)]
    if kind == "chord":
        return _first_tasks(kw["body"]) if kw.get("body") else []
    return [data]


def _call_errbacks(app: Celery, data: dict[str, Any], error: str) -> None:
    from pyrula_compat.app.task import Context
    from pyrula_compat.canvas import Signature

    options = data.get("options") or {}
    errbacks = options.get("link_error") or []
    if not errbacks:
        return
    task_id = options.get("task_id")
    exc, tb = errors.from_json(error)
    request = Context(
        id=task_id, task=data.get("task"), args=codec.from_json(list(data.get("args") or [])),
        kwargs=codec.from_json(dict(data.get("kwargs") or {})), called_directly=False,
    )  # fmt: skip
    for item in errbacks if isinstance(errbacks, list) else [errbacks]:
        sig = Signature.from_dict(item, app)
        task = app.tasks.get(sig.task)
        if task is None or _arity(task) <= 1:  # old style: queued with the body's id
            submit_signature(app, item, [task_id], {})
            continue
        try:
            task(request, exc, tb, *sig.args, **sig.kwargs)
        except Exception:
            log.exception("chord body %s[%s]: errback %s raised", data.get("task"), task_id,
                          sig.task)  # fmt: skip


def make_canvas_workflows(app: Celery, registry: Registry) -> list[WorkflowDefinition]:
    """``celery.chord``, ``celery.chain`` (a chain that is a chord header member) and
    ``celery.replaced`` (a canvas member of a ``Task.replace`` replacement)."""

    async def chord_flow(
        ctx: WorkflowContext,
        header: list[dict[str, Any]],
        body: dict[str, Any],
        args: list[Any] | None = None,
        chain: list[dict[str, Any]] | None = None,
    ) -> Any:
        children = [_child_params(app, member, list(args or [])) for member in header]
        runs = [ctx.run_child(name, params) for name, params in children]
        results = await ctx.gather(*runs, return_exceptions=True)
        for index, value in enumerate(results):
            if isinstance(value, BaseException):
                culprit = f"{ctx.run_id}.{2 * index}"
                error = ChordError(f"Dependency {culprit} raised {_reason(value)}")
                text = errors.to_json(error)
                await ctx.step("body", fail_body, app, body, text)
                for data in chain or ():
                    await ctx.step(f"chain-{data.get('task')}", mark_failed, app, data, text)
                raise error
        values = [codec.from_json(v) for v in results]
        await ctx.step("body", submit_signature, app, body, [values], {}, chain=chain)
        return None

    async def chain_flow(
        ctx: WorkflowContext, tasks: list[dict[str, Any]], args: list[Any] | None = None
    ) -> Any:
        value_args = list(args or [])
        result: Any = None
        for data in tasks:
            name, params = _child_params(app, data, value_args)
            result = await ctx.run_child(name, params)
            value_args = [codec.from_json(result)]
        return result

    from pyrula_compat.replace import make_replace_workflow

    return [
        workflow(name="celery.chord", registry=registry)(chord_flow),
        workflow(name="celery.chain", registry=registry)(chain_flow),
        make_replace_workflow(app, registry),
    ]
