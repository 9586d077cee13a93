"""The canvas primitives: ``chain``, ``group``, ``chord``, ``chunks``, ``xmap``,
``xstarmap``.

See :mod:`pyrula_compat.canvas` for how each composes on the engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyrula_compat import trail
from pyrula_compat.canvas import (
    CHAIN,
    CHORD,
    GENERATED_ID,
    GROUP,
    Signature,
    _as_list,
    _iterable,
    maybe_signature,
)
from pyrula_compat.canvas_links import attach, callbacks, check_arguments
from pyrula_compat.canvas_stamps import StampingVisitor, stamp_headers, stamp_members
from pyrula_compat.result import AsyncResult, EagerResult, GroupResult
from pyrula_compat.utils import uuid

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery


class _Tasks(Signature):
    """A signature over a list of signatures (``kwargs["tasks"]``): chain and group."""

    @property
    def tasks(self) -> list[Signature]:
        return list(self.kwargs.get("tasks") or [])

    @classmethod
    def from_dict(cls, d: dict[str, Any], app: Celery | None = None) -> Signature:
        tasks = [Signature.from_dict(t, app) for t in (d.get("kwargs") or {}).get("tasks", [])]
        make: Any = cls  # a subclass: its __init__ takes the tasks positionally
        made: Signature = make(*tasks, app=app, **(d.get("options") or {}))
        return made


@Signature.register_type(name="chain")
class _chain(_Tasks):
    """``chain(a.s(), b.s(), c.s())`` or ``a.s() | b.s() | c.s()``."""

    def __init__(self, *tasks: Any, **options: Any) -> None:
        app = options.pop("app", None)
        if len(tasks) == 1 and not isinstance(tasks[0], Signature) and _iterable(tasks[0]):
            tasks = tuple(tasks[0])
        flat: list[Signature] = []
        for item in tasks:
            sig = maybe_signature(item, app=app)
            if isinstance(sig, _chain):
                flat.extend(sig.tasks)
            elif sig is not None:
                flat.append(sig)
        Signature.__init__(
            self, "celery.chain", (), {"tasks": flat}, options, subtask_type=CHAIN, app=app
        )

    def __or__(self, other: Any) -> Signature:
        if isinstance(other, _chain):
            return _chain(*self.tasks, *other.tasks, app=self._app)
        if isinstance(other, Signature):
            return _chain(*self.tasks, other, app=self._app)
        return NotImplemented

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def steps(self) -> list[Signature]:
        """The tasks, with each group followed by another step turned into a chord (a
        ``chunks`` is its group)."""
        out: list[Signature] = []
        pending = [t.group() if isinstance(t, chunks) else t for t in self.tasks]
        index = 0
        while index < len(pending):
            sig = pending[index]
            if isinstance(sig, group) and index + 1 < len(pending):
                out.append(chord(sig, pending[index + 1], app=self._app))
                index += 2
                continue
            out.append(sig)
            index += 1
        return out

    def stamp(  # type: ignore[override]
        self, visitor: StampingVisitor | None = None, append_stamps: bool = False, **headers: Any
    ) -> None:
        """Stamp the chain's links and every task in it."""
        stamp_members(
            self, self.tasks, visitor, append_stamps, "on_chain_start", "on_chain_end",
            links_append=False, **headers,
        )  # fmt: skip

    def unchain_tasks(self) -> list[Signature]:
        """Copies of the tasks, the chain's ``link`` callbacks on the last and its
        ``link_error`` errbacks on each, as Celery's."""
        tasks = [t.clone() for t in self.tasks]
        if tasks:
            for sig in _as_list(self.options.get("link")):
                tasks[-1].link(sig)
            for sig in _as_list(self.options.get("link_error")):
                for task in tasks:
                    task.link_error(sig)
        return tasks

    def freeze(self, _id: str | None = None, **kwargs: Any) -> Any:
        """Fix the ids of :meth:`steps` and keep the chain in that form (a group then a
        task as the chord frozen), so a frozen chain sent later (a group member, a link)
        runs with the ids its result names."""
        steps = self.steps()
        results = _freeze_steps(steps, _id)
        self["kwargs"]["tasks"] = steps
        return results[-1] if results else None

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Submit the first step (with the other options: ``countdown``...); each
        finished run submits the next. ``link`` goes to the last task, ``link_error`` to
        every task (:mod:`~pyrula_compat.canvas_links`). Returns the last step's result,
        whose ``parent`` links back through the chain."""
        app = self.app
        if app.conf.task_always_eager:
            return self.apply(args, kwargs, **options)
        merged = {**self.options, **options}
        link = callbacks(merged.pop("link", None), app)
        link_error = callbacks(merged.pop("link_error", None), app)
        merged.pop(GENERATED_ID, None)
        steps = self.steps()
        if not steps:
            return None
        check_arguments(steps[0], args, kwargs)
        results = _freeze_steps(steps, merged.pop("task_id", None))
        data = attach(_chain_json(steps), link, link_error)["kwargs"]["tasks"]
        from pyrula_compat import flows

        with trail.suppressed():
            flows.submit_signature(
                app, data[0], list(args or ()), dict(kwargs or {}), chain=data[1:], options=merged
            )
        trail.add(results[0], merged.get("add_to_parent", True))
        return results[-1]

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the steps here, one after another; ``link`` runs once, after the last."""
        merged = {**self.options, **options}
        link = callbacks(merged.pop("link", None), self.app)
        link_error = callbacks(merged.pop("link_error", None), self.app)
        task_id = merged.pop("task_id", None)
        merged.pop(GENERATED_ID, None)
        last: Any = None
        call_args: Any = tuple(args or ())
        steps = self.steps()
        for index, sig in enumerate(steps):
            is_last = index == len(steps) - 1
            if link or link_error:
                data = attach(sig.as_json(), link if is_last else [], link_error)
                sig = Signature.from_dict(data, self.app)
            step_options = {**merged, "task_id": task_id} if is_last and task_id else merged
            res = sig.apply(call_args, kwargs if last is None else None, **step_options)
            if isinstance(res, EagerResult) or hasattr(res, "get"):
                res.parent = last
            last = res
            call_args = (res.get(),)
        return last


def _chain_json(steps: list[Signature]) -> dict[str, Any]:
    return {"subtask_type": CHAIN, "kwargs": {"tasks": [s.as_json() for s in steps]}}


def _freeze_steps(steps: list[Signature], last_id: str | None) -> list[Any]:
    results: list[Any] = []
    previous: Any = None
    for index, sig in enumerate(steps):
        is_last = index == len(steps) - 1
        res = sig.freeze(last_id if is_last else None)
        if isinstance(res, AsyncResult) and previous is not None:
            res.parent = previous
            if res._creator is None:
                res._creator = previous
        results.append(res)
        previous = res
    return results


@Signature.register_type()
class group(_Tasks):
    """Run signatures in parallel; ``get()`` gives their results in order."""

    def __init__(self, *tasks: Any, **options: Any) -> None:
        app = options.pop("app", None)
        if len(tasks) == 1 and not isinstance(tasks[0], Signature) and _iterable(tasks[0]):
            tasks = tuple(tasks[0])
        members = [s for s in (maybe_signature(t, app=app) for t in tasks) if s is not None]
        Signature.__init__(
            self, "celery.group", (), {"tasks": members}, options, subtask_type=GROUP, app=app
        )

    def __or__(self, other: Any) -> Signature:
        if isinstance(other, Signature) and not isinstance(other, _chain):
            return chord(self, other, app=self._app)
        return super().__or__(other)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def __len__(self) -> int:  # a group's length is its members', as in Celery
        return len(self.tasks)

    def __bool__(self) -> bool:
        return True

    def stamp(  # type: ignore[override]
        self, visitor: StampingVisitor | None = None, append_stamps: bool = False, **headers: Any
    ) -> None:
        """Stamp the group's links and every member."""
        stamp_members(
            self, self.tasks, visitor, append_stamps, "on_group_start", "on_group_end", **headers
        )

    def skew(self, start: float = 1.0, stop: float | None = None, step: float = 1.0) -> group:
        """Spread the members out: ``countdown`` ``start``, ``start + step``, ... (held at
        ``stop`` once it is reached). Returns the group."""
        countdown = start
        for task in self.tasks:
            task.set(countdown=countdown)
            if stop is None or countdown + step <= stop:
                countdown += step
        return self

    def link(self, callback: Any) -> Any:
        """As in Celery: the first member's callback, made immutable (that member's
        result alone would not be the group's)."""
        sig = maybe_signature(callback, app=self._app)
        if sig is None or not self.tasks:
            return callback
        return self.tasks[0].link(sig.clone().set(immutable=True))

    def link_error(self, errback: Any) -> Any:
        """As in Celery: a copy of the errback on every member (any can fail)."""
        sig = maybe_signature(errback, app=self._app)
        if sig is None:
            return ()
        return tuple(member.link_error(sig.clone()) for member in self.tasks)

    def freeze(self, _id: str | None = None, **kwargs: Any) -> GroupResult:  # type: ignore[override]
        group_id = self.options.get("task_id") or _id or uuid()
        self.options["task_id"] = group_id
        members = [t.freeze() for t in self.tasks]
        self["kwargs"]["tasks"] = self.tasks  # keep the frozen ids
        return GroupResult(group_id, members, app=self.app)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Send every member with the partial ``args``; the group's options go to every
        member. ``link=``/``link_error=`` raise TypeError, as in Celery: a callback after
        the whole group is a chord, an errback goes on the members (:meth:`link_error`)."""
        if options.get("link") is not None:
            raise TypeError("Cannot add link to group: use a chord")
        if options.get("link_error") is not None:
            raise TypeError("Cannot add link to group: do that on individual tasks")
        app = self.app
        if app.conf.task_always_eager:
            return self.apply(args, kwargs, **options)
        merged = {k: v for k, v in self.options.items() if k not in ("task_id", GENERATED_ID)}
        merged.update(options)
        link = callbacks(merged.pop("link", None), app)
        link_error = callbacks(merged.pop("link_error", None), app)
        check_arguments(self, args, kwargs)
        result = self.freeze(merged.pop("task_id", None))
        from pyrula_compat import flows

        data = attach(self.as_json(), link, link_error)
        with trail.suppressed():
            flows.submit_signature(app, data, list(args or ()), dict(kwargs or {}), options=merged)
        trail.add(result, merged.get("add_to_parent", True))
        return result

    def apply(  # type: ignore[override]
        self, args: Any = None, kwargs: Any = None, **options: Any
    ) -> GroupResult:
        group_id = self.options.get("task_id") or uuid()
        return GroupResult(group_id, [t.apply(args, kwargs, **options) for t in self.tasks])


@Signature.register_type()
class chord(Signature):
    """``chord(header, body)``: the body runs with the header's results, in order."""

    def __init__(self, header: Any, body: Any = None, **options: Any) -> None:
        app = options.pop("app", None)
        options.pop("task", None)
        members = header.tasks if isinstance(header, group) else list(header)
        head = group(*members, app=app)
        Signature.__init__(
            self, "celery.chord", (), {"header": head, "body": maybe_signature(body, app=app)},
            options, subtask_type=CHORD, app=app,
        )  # fmt: skip

    @property
    def tasks(self) -> list[Signature]:
        return self.header.tasks

    @property
    def header(self) -> group:
        return self.kwargs["header"]  # type: ignore[no-any-return]

    @property
    def body(self) -> Signature | None:
        return self.kwargs.get("body")

    @classmethod
    def from_dict(cls, d: dict[str, Any], app: Celery | None = None) -> Signature:
        kw = d.get("kwargs") or {}
        header = Signature.from_dict(kw["header"], app)
        body = Signature.from_dict(kw["body"], app) if kw.get("body") else None
        return cls(header, body, app=app, **(d.get("options") or {}))

    def __call__(self, body: Any = None, **options: Any) -> Any:
        return self.apply_async((), {"body": body} if body is not None else {}, **options)

    def stamp(  # type: ignore[override]
        self, visitor: StampingVisitor | None = None, append_stamps: bool = False, **headers: Any
    ) -> None:
        """Stamp the chord's links and header tasks; the body too when a visitor says
        what to stamp there (``on_chord_body``), as in Celery."""
        headers = stamp_members(
            self, self.tasks, visitor, append_stamps,
            "on_chord_header_start", "on_chord_header_end", **headers,
        )  # fmt: skip
        body = self.body
        if visitor is not None and body is not None:
            extra = visitor.on_chord_body(self, **headers) or {}
            body.stamp(
                visitor, append_stamps, **stamp_headers(self, extra, append_stamps, **headers)
            )

    def link(self, callback: Any) -> Any:
        """The body's callback, as in Celery."""
        body = self.body
        if body is None:  # chord(header) called with its body later: attached then
            return super().link(callback)
        return body.link(callback)

    def link_error(self, errback: Any) -> Any:
        """The body's errback, as in Celery (by default, not the header's): it is called
        with the ``ChordError`` when a header task fails."""
        body = self.body
        if body is None:
            return super().link_error(errback)
        return body.link_error(errback)

    def freeze(self, _id: str | None = None, **kwargs: Any) -> AsyncResult:
        """Fix the chord's ids: its run (the group id), the header's child runs
        (``<group id>.<position>``) and the body; return the body's result."""
        body = self.body
        if body is None:
            raise ValueError("a chord needs a body: chord(header, body) or chord(header)(body)")
        group_id = self.options.get("task_id") or uuid()
        self.options["task_id"] = group_id
        header_results = [
            AsyncResult(f"{group_id}.{2 * i}", app=self.app, task_name=t.task)
            for i, t in enumerate(self.header.tasks)
        ]
        runner = AsyncResult(group_id, app=self.app, task_name="celery.chord")
        for res in header_results:
            res._creator = runner
        body_result = body.freeze(_id)
        body_result.parent = GroupResult(group_id, header_results, app=self.app)
        body_result._creator = runner
        return body_result

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        kwargs = dict(kwargs or {})
        if kwargs.get("body") is not None:
            self["kwargs"]["body"] = maybe_signature(kwargs.pop("body"), app=self._app)
        app = self.app
        if app.conf.task_always_eager:
            return self.apply(args, kwargs, **options)
        merged = {k: v for k, v in self.options.items() if k not in ("task_id", GENERATED_ID)}
        merged.update(options)
        link = callbacks(merged.pop("link", None), app)
        link_error = callbacks(merged.pop("link_error", None), app)
        if self.body is not None:
            check_arguments(self, args, kwargs)
        result = self.freeze(merged.pop("task_id", None))
        data = self.as_json()
        attach(data["kwargs"]["body"], link, link_error)
        from pyrula_compat import flows

        # countdown/eta hold back the whole chord (the header first, as in Celery 5.6)
        with trail.suppressed():
            flows.submit_signature(app, data, list(args or ()), kwargs, options=merged)
        trail.add(result.parent, merged.get("add_to_parent", True))  # the header, as Celery
        return result

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        body = self.body
        if body is None:
            raise ValueError("a chord needs a body")
        merged = {k: v for k, v in self.options.items() if k not in ("task_id", GENERATED_ID)}
        merged.update(options)
        link = callbacks(merged.pop("link", None), self.app)
        link_error = callbacks(merged.pop("link_error", None), self.app)
        if link or link_error:
            body = Signature.from_dict(attach(body.as_json(), link, link_error), self.app)
        values = self.header.apply(args, kwargs).get(propagate=True)
        return body.apply((values,), **merged)


chain = _chain


@Signature.register_type()
class chunks(Signature):
    """``add.chunks(zip(xs, ys), 10)``: the argument tuples in chunks of ``n``, each
    chunk one ``celery.starmap`` task (:class:`xstarmap`). Calling it runs
    :meth:`group`: the result is a GroupResult whose ``get()`` is one list per chunk.

    As a member of a group or chord header, or sent by name, it is one run of the
    built-in ``celery.chunks`` task (``freeze()`` gives its id, as Celery's signature
    freeze does), whose result is that list of lists (:func:`replace.run_chunks`)."""

    def __init__(self, task: Any, it: Iterable[Any], n: int, **options: Any) -> None:
        app = options.pop("app", None)
        options.pop("task", None)
        sig = self._signature(task, app)
        if int(n) < 1:
            raise ValueError(f"chunks needs a chunk size of at least 1, got {n!r}")
        Signature.__init__(
            self, "celery.chunks", (), {"task": sig, "it": [list(x) for x in it], "n": int(n)},
            options, immutable=True, app=app,
        )  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any], app: Celery | None = None) -> Signature:
        kw = d.get("kwargs") or {}
        return cls(kw["task"], kw["it"], kw["n"], app=app, **(d.get("options") or {}))

    @staticmethod
    def _signature(task: Any, app: Celery | None) -> Signature:
        sig = Signature(task, app=app) if isinstance(task, str) else maybe_signature(task, app)
        if sig is None:
            raise TypeError("chunks needs a task or a signature")
        return sig

    def group(self) -> group:
        """The chunk tasks as a group, in order."""
        kw = self.kwargs
        task = self._signature(kw["task"], self._app)
        items, n = list(kw["it"]), int(kw["n"])
        parts = [items[i : i + n] for i in range(0, len(items), n)]
        return group(*(xstarmap(task, part, app=self._app) for part in parts), app=self._app)

    def __call__(self, **options: Any) -> Any:
        return self.apply_async(**options)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        return self.group().apply_async(args, kwargs, **options)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        return self.group().apply(args, kwargs, **options)

    @classmethod
    def apply_chunks(cls, task: Any, it: Iterable[Any], n: int, app: Celery | None = None) -> Any:
        return cls(task, it, n, app=app)()

    def __repr__(self) -> str:
        kw = self.kwargs
        return f"chunks({kw['task']!r}, {_truncated(kw['it'])}, {kw['n']})"


class _basemap(Signature):
    """One task calling ``task`` on each item of ``it``, in one run (immutable, as in
    Celery: in a chain the previous result is not prepended)."""

    _task_name = ""
    _star = ""

    def __init__(self, task: Any, it: Iterable[Any], **options: Any) -> None:
        app = options.pop("app", None)
        options.pop("task", None)
        sig = None if isinstance(task, str) else maybe_signature(task, app=app)
        name = task if sig is None else sig.task  # the built-in task takes the name
        items = [list(x) for x in it] if self._star else list(it)
        Signature.__init__(
            self, self._task_name, (), {"task": name, "it": items}, options, immutable=True,
            app=app or (sig._app if sig is not None else None),
        )  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any], app: Celery | None = None) -> Signature:
        kw = d.get("kwargs") or {}
        return cls(kw["task"], kw["it"], app=app, **(d.get("options") or {}))

    def __repr__(self) -> str:
        kw = self.kwargs
        return f"[{kw['task']}({self._star}x) for x in {_truncated(kw['it'])}]"


@Signature.register_type()
class xmap(_basemap):
    """``add.map(xs)``: one ``celery.map`` task returning ``[add(x) for x in xs]``."""

    _task_name = "celery.map"


@Signature.register_type()
class xstarmap(_basemap):
    """``add.starmap(pairs)``: one ``celery.starmap`` task returning
    ``[add(*x) for x in pairs]``."""

    _task_name = "celery.starmap"
    _star = "*"


def _truncated(value: Any, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
