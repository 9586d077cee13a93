"""Where a canvas's callbacks go, and which arguments are checked when it is called, as
in Celery 5.

``link`` given to a chain (``apply_async(link=)`` or ``c.link(sig)``) goes to its last
task, ``link_error`` to every task; a chord's go to its body (a chain body: its last
task, every task). A group's options reach every member. Each place a callback is
attached to gets its own copy with its own id, fixed when the canvas is called, so a
replayed submission repeats the same ids.

When the canvas is sent, each task Celery would send at the call site has its arguments
checked against its body (``Task.typing``, on by default): a chain's first task, with
the arguments given; each group member and chord header member with the group's partial
arguments. The other tasks are sent later by a worker, and checked nowhere here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.canvas import Signature


def callbacks(value: Any, app: Celery | None) -> list[Signature]:
    """``value`` (one signature, a list of them, or None) as a list of Signatures."""
    from pyrula_compat.canvas import maybe_signature

    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else [value]
    return [s for s in (maybe_signature(item, app=app) for item in items) if s is not None]


def attach(
    data: dict[str, Any], link: list[Signature], link_error: list[Signature]
) -> dict[str, Any]:
    """Attach ``link``/``link_error`` to the JSON of a canvas, in place, where Celery
    attaches them; each attachment a frozen copy with its own id. Returns ``data``."""
    if not link and not link_error:
        return data
    kind = data.get("subtask_type")
    kw = data.get("kwargs") or {}
    if kind == "chain":
        steps = list(kw.get("tasks") or [])
        for index, step in enumerate(steps):
            attach(step, link if index == len(steps) - 1 else [], link_error)
        return data
    if kind == "group":
        for member in kw.get("tasks") or []:
            attach(member, link, link_error)
        return data
    if kind == "chord":
        if kw.get("body"):
            attach(kw["body"], link, link_error)
        return data
    options = data.setdefault("options", {})
    for key, sigs in (("link", link), ("link_error", link_error)):
        if sigs:
            options[key] = [*_as_list(options.get(key)), *(_frozen_copy(s) for s in sigs)]
    return data


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _frozen_copy(sig: Signature) -> dict[str, Any]:
    copy = sig.clone()
    copy.freeze()
    return copy.as_json()


def check_arguments(sig: Signature, args: Any, kwargs: Any) -> None:
    """Raise TypeError, as Celery's ``Task.apply_async`` does at the call site, when a
    task this canvas sends now does not take its arguments (see the module docstring)."""
    from pyrula_compat.canvas import CHAIN, CHORD, GROUP

    kind = sig.subtask_type
    if kind == CHAIN:
        steps = list(sig.kwargs.get("tasks") or [])
        if steps:
            check_arguments(steps[0], args, kwargs)
        return
    if kind == GROUP:
        for member in sig.kwargs.get("tasks") or []:
            check_arguments(member, args, kwargs)
        return
    if kind == CHORD:
        header = sig.kwargs.get("header")
        for member in (header.kwargs.get("tasks") if header is not None else None) or []:
            check_arguments(member, args, kwargs)
        return
    if sig.task.startswith("celery."):  # the built-in tasks (map, starmap, chunks)
        return
    task = sig.app.tasks.get(sig.task)
    if task is None or not task._typing():
        return
    call_args, call_kwargs = sig._merged(args, kwargs)
    task.check_arguments(*call_args, **call_kwargs)
