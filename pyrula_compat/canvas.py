"""Signatures and the canvas (``celery.canvas``): chain, group, chord, on the engine.

Every id is fixed when a canvas is called ("frozen"), so its results are known at once.
A chain continues from inside each finished task's run, which submits the next
signature with its fixed id in a journaled step (no lost message, no duplicate); a
failure stops it and marks the rest failed with the same error. A group submits each
member. A chord is a run of the internal ``celery.chord`` workflow that gathers the
header as child runs and then submits the body, or fails it with ``ChordError``: no
polling task, and nothing to hang on.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, MutableSequence
from typing import TYPE_CHECKING, Any, TypeVar

from pyrula_compat import canvas_stamps, codec
from pyrula_compat._state import get_current_app
from pyrula_compat.canvas_stamps import StampingVisitor
from pyrula_compat.exceptions import NotRegistered
from pyrula_compat.result import AsyncResult, EagerResult
from pyrula_compat.utils import uuid

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.app.task import Task

_S = TypeVar("_S", bound="Signature")
_Result = AsyncResult  # in Signature's body, ``AsyncResult`` names its property

CHAIN, GROUP, CHORD = "chain", "group", "chord"
GENERATED_ID = "pyrula_generated_id"
"""The option :meth:`Signature.freeze` sets to the id it generated. A run submitted with
that id needs no idempotency key, as ``delay()``'s generated id needs none (nobody
chose it to repeat it): one store call instead of two. A repeat of such a submission (a
chain step's run replayed after a crash) finds its own run there (``calling.submit``).
An id the caller set (``task_id=``, ``.set(task_id=...)``) is still the key."""


class Signature(dict):  # type: ignore[type-arg]
    """A task call to make later: name, args, kwargs and options. A JSON-able dict."""

    TYPES: dict[str, type[Signature]] = {}
    """The signature classes by ``subtask_type``, which :meth:`from_dict` rebuilds."""

    @classmethod
    def register_type(cls, name: str | None = None) -> Callable[[type[_S]], type[_S]]:
        """A class decorator: ``from_dict`` rebuilds a dict whose ``subtask_type`` is
        ``name`` (default: the class's name) as that class."""

        def register(subclass: type[_S]) -> type[_S]:
            cls.TYPES[name or subclass.__name__] = subclass
            return subclass

        return register

    def __init__(
        self,
        task: Any = None,
        args: Any = None,
        kwargs: Any = None,
        options: Any = None,
        type: Any = None,
        subtask_type: str | None = None,
        immutable: bool = False,
        app: Celery | None = None,
        **ex: Any,
    ) -> None:
        self._app = app
        if isinstance(task, dict):
            super().__init__(task)
            self._type: Task | None = None
            return
        self._type = task if task is not None and not isinstance(task, str) else type
        name = task if isinstance(task, str) else getattr(task, "name", None)
        super().__init__(
            task=name,
            args=tuple(args or ()),
            kwargs=dict(kwargs or {}),
            options=dict(options or {}, **ex),
            subtask_type=subtask_type,
            immutable=immutable,
            chord_size=None,
        )

    # -- fields --------------------------------------------------------------------------
    @property
    def app(self) -> Celery:
        if self._app is not None:
            return self._app
        task = self._type
        if task is not None:
            return task.app
        for member in self._members():  # a canvas belongs to its tasks' app
            if member._app is not None or member._type is not None:
                return member.app
        return get_current_app()

    def _members(self) -> list[Signature]:
        kw = self.get("kwargs") or {}
        found = [*(kw.get("tasks") or []), kw.get("body"), *((kw.get("header") or {}) and
                 (kw["header"].get("kwargs") or {}).get("tasks", []))]  # fmt: skip
        return [m for m in found if isinstance(m, Signature)]

    @property
    def task(self) -> str:
        return str(self["task"])

    @property
    def name(self) -> str:
        return self.task

    @property
    def args(self) -> tuple[Any, ...]:
        return tuple(self.get("args") or ())

    @args.setter
    def args(self, value: Any) -> None:
        self["args"] = tuple(value)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.get("kwargs") or {})

    @kwargs.setter
    def kwargs(self, value: Any) -> None:
        self["kwargs"] = dict(value)

    @property
    def options(self) -> dict[str, Any]:
        return self.setdefault("options", {})  # type: ignore[no-any-return]

    @property
    def immutable(self) -> bool:
        return bool(self.get("immutable"))

    @property
    def subtask_type(self) -> str | None:
        return self.get("subtask_type")

    @property
    def id(self) -> str | None:
        return self.options.get("task_id")

    @property
    def parent_id(self) -> str | None:
        return self.options.get("parent_id")

    @property
    def root_id(self) -> str | None:
        return self.options.get("root_id")

    @property
    def AsyncResult(self) -> Any:
        """The task's ``AsyncResult`` (its own class, for a task that has one)."""
        try:
            return self.type.AsyncResult
        except NotRegistered:
            return AsyncResult

    @property
    def type(self) -> Task:
        if self._type is None:
            try:
                self._type = self.app.tasks[self.task]
            except KeyError:
                raise NotRegistered(self.task) from None
        return self._type

    def __repr__(self) -> str:
        return _reprcall(self.task, self.args, self.kwargs)

    def reprcall(self, *args: Any, **kwargs: Any) -> str:
        """How the call would read with ``args``/``kwargs`` merged in (as partial
        arguments, even when immutable): ``add.s(2).reprcall(3)`` is ``'add(3, 2)'``."""
        return _reprcall(self.task, tuple(args) + self.args, {**self.kwargs, **kwargs})

    # -- building ------------------------------------------------------------------------
    def clone(self, args: Any = None, kwargs: Any = None, **opts: Any) -> Signature:
        """A copy with ``args`` prepended (unless immutable), ``kwargs`` merged over."""
        new = copy.deepcopy(self)
        new._app, new._type = self._app, self._type
        if not self.immutable:
            if args:
                new["args"] = tuple(args) + self.args
            if kwargs:
                new["kwargs"] = {**self.kwargs, **kwargs}
        new.options.update(opts)
        return new

    partial = clone

    def __deepcopy__(self, memo: dict[int, Any]) -> Signature:
        new = type(self).__new__(type(self))
        dict.__init__(new, copy.deepcopy(dict(self), memo))
        new._app, new._type = self._app, self._type
        return new

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        if immutable is not None:
            self["immutable"] = immutable
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        self["immutable"] = immutable

    def replace(self, args: Any = None, kwargs: Any = None, options: Any = None) -> Signature:
        """A copy with ``args``, ``kwargs`` or ``options`` replaced (those not ``None``)."""
        new = self.clone()
        if args is not None:
            new.args = args
        if kwargs is not None:
            new.kwargs = kwargs
        if options is not None:
            new["options"] = dict(options)
        return new

    def append_to_list_option(self, key: str, value: Any) -> Any:
        """Add ``value`` to the list option ``key`` unless it is there; return it."""
        items = self.options.setdefault(key, [])
        if not isinstance(items, MutableSequence):
            items = self.options[key] = [items]
        if value not in items:
            items.append(value)
        return value

    def extend_list_option(self, key: str, value: Any) -> None:
        """Extend the list option ``key`` with ``value`` (one item or several)."""
        items = self.options.setdefault(key, [])
        if not isinstance(items, MutableSequence):
            items = self.options[key] = [items]
        items.extend(value if isinstance(value, list | tuple) else [value])

    def stamp(
        self, visitor: StampingVisitor | None = None, append_stamps: bool = False, **headers: Any
    ) -> Signature:
        """Stamp custom headers on this signature and its links
        (:mod:`~pyrula_compat.canvas_stamps`); returns the signature."""
        return canvas_stamps.stamp_signature(self, visitor, append_stamps, **headers)

    def stamp_links(
        self, visitor: StampingVisitor | None, append_stamps: bool = False, **headers: Any
    ) -> None:
        """Stamp this signature's callbacks and errbacks only."""
        canvas_stamps.stamp_links(self, visitor, append_stamps, **headers)

    def election(self) -> Any:
        """Celery's leader election among workers, over the broker's broadcast: pyrula
        has no broadcast, and needs none to run a task once: raises ``NotImplementedError``
        saying to submit it with a fixed ``task_id``."""
        raise NotImplementedError(
            "Signature.election() (Celery's worker election over broker broadcast) does "
            "not exist on pyrula: to have one worker run the task once, submit it with a "
            "fixed id, sig.apply_async(task_id=...): a store runs one task per id"
        )

    def flatten_links(self) -> list[Signature]:
        """This signature and, depth first, every callback linked to it and to them."""
        found: list[Signature] = [self]
        for link in _as_list(self.options.get("link")):
            sig = maybe_signature(link, app=self._app)
            if sig is not None:
                found.extend(sig.flatten_links())
        return found

    def link(self, callback: Any) -> Any:
        self.options.setdefault("link", []).append(callback)
        return callback

    def link_error(self, errback: Any) -> Any:
        self.options.setdefault("link_error", []).append(errback)
        return errback

    def on_error(self, errback: Any) -> Signature:
        """:meth:`link_error` that returns this signature, not the errback, so that
        ``add.s(2, 2).on_error(err.s()).delay()`` calls ``add`` (as in Celery)."""
        self.link_error(errback)
        return self

    def freeze(self, _id: str | None = None, **kwargs: Any) -> _Result:
        """Fix the task id now (idempotent) and return its result."""
        task_id = self.options.get("task_id") or _id
        if not task_id:
            task_id = uuid()
            self.options[GENERATED_ID] = task_id  # see GENERATED_ID
        self.options["task_id"] = task_id
        return AsyncResult(task_id, app=self.app, task_name=self.task)

    def as_json(self) -> dict[str, Any]:
        """The signature as plain JSON (nested signatures too)."""
        return codec.to_json(dict(self))  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: dict[str, Any], app: Celery | None = None) -> Signature:
        kind = d.get("subtask_type")
        maker_of_kind = cls.TYPES.get(kind) if kind else None
        if maker_of_kind is not None and maker_of_kind is not cls:
            return maker_of_kind.from_dict(d, app)
        maker = _BY_TASK.get(d.get("task") or "")
        if maker is not None and not kind:
            made: Signature = maker.from_dict(d, app)
            return made
        return Signature(codec.from_json(dict(d)), app=app)

    # -- calling -------------------------------------------------------------------------
    def _merged(self, args: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.immutable:
            return self.args, self.kwargs
        return tuple(args or ()) + self.args, {**self.kwargs, **dict(kwargs or {})}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here and now (not queued)."""
        call_args, call_kwargs = self._merged(args, kwargs)
        return self.type(*call_args, **call_kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Queue the call, with call-time ``args`` prepended and options merged over."""
        call_args, call_kwargs = self._merged(args, kwargs)
        merged = {**self.options, **options}
        link, link_error = merged.pop("link", None), merged.pop("link_error", None)
        try:
            task = self.type
        except NotRegistered:
            return self.app.send_task(
                self.task, call_args, call_kwargs, link=link, link_error=link_error, **merged
            )
        return task.apply_async(call_args, call_kwargs, link=link, link_error=link_error, **merged)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> EagerResult:
        call_args, call_kwargs = self._merged(args, kwargs)
        merged = {**self.options, **options}
        return self.type.apply(call_args, call_kwargs, **merged)

    def __or__(self, other: Any) -> Signature:
        if isinstance(other, _chain):
            return _chain(self, *other.tasks, app=self._app)
        if isinstance(other, Signature):
            return _chain(self, other, app=self._app)
        return NotImplemented

    def __reduce__(self) -> tuple[Any, ...]:
        return (signature, (dict(self),))


def maybe_signature(d: Any, app: Celery | None = None, clone: bool = False) -> Signature | None:
    """``d`` as a Signature: None stays None; a dict is rebuilt; a task gives ``.s()``."""
    if d is None:
        return None
    if isinstance(d, Signature):
        if app is not None and d._app is None:
            d._app = app
        return d.clone() if clone else d
    if isinstance(d, dict):
        return Signature.from_dict(d, app)
    if hasattr(d, "s") and hasattr(d, "apply_async"):
        return d.s()  # type: ignore[no-any-return]
    raise TypeError(f"cannot make a signature of {d!r}")


def signature(varies: Any, *args: Any, **kwargs: Any) -> Signature:
    """``signature("proj.tasks.add", args=(2, 2))``, a task, or a signature dict."""
    app = kwargs.get("app")
    if isinstance(varies, dict):
        if isinstance(varies, Signature):
            return varies.clone()
        return Signature.from_dict(varies, app=app)
    return Signature(varies, *args, **kwargs)


subtask = signature


def _reprcall(name: str, args: Iterable[Any], kwargs: dict[str, Any]) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _iterable(value: Any) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, dict))


__all__ = [
    "Signature",
    "StampingVisitor",
    "chain",
    "chord",
    "chunks",
    "group",
    "maybe_signature",
    "signature",
    "subtask",
    "xmap",
    "xstarmap",
]

# The primitives subclass Signature, so they are defined after it.
from pyrula_compat.primitives import (  # noqa: E402
    _chain,
    chain,
    chord,
    chunks,
    group,
    xmap,
    xstarmap,
)

_BY_TASK: dict[str, Any] = {"celery.chunks": chunks, "celery.map": xmap, "celery.starmap": xstarmap}
"""Signatures of these built-in tasks come back as their own class from a dict."""
