"""``Task`` and its ``request`` context (``celery.app.task``).

A task object is a module-level instance whose class carries the decorator's options
as attributes (``add.max_retries``, ``add.queue``, even unknown ones). ``add.run`` is
the plain function; ``add.delay`` / ``add.apply_async`` / ``add.retry`` are ordinary
methods, so ``mock.patch("proj.tasks.add.delay")`` and ``add.delay = fake`` work.

As in Celery, every way of calling a task goes through the methods of its class, so a
base class that overrides them (``app.Task = ContextTask``) sees every call: ``delay``
calls ``self.apply_async``, a signature calls its task's ``apply_async``, the worker
and eager mode run the body through ``task.__call__`` when the class overrides it (else
``task.run``), and the hooks (``before_start``, ``on_success``, ``on_retry``,
``on_failure``, ``after_return``) get Celery's arguments. ``Task.app`` is a class
property: the class's app, the current app while it has none (a shared task's).
"""

from __future__ import annotations

import inspect
import sys
import threading
from datetime import datetime
from types import GenericAlias
from typing import TYPE_CHECKING, Any

from pyrula_compat import _state, states
from pyrula_compat.app.from_config import FROM_CONFIG, STRICT_TYPING, from_config
from pyrula_compat.app.unsupported import Unsupported
from pyrula_compat.exceptions import MaxRetriesExceededError, OperationalError, Retry
from pyrula_compat.utils import uuid

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery
    from pyrula_compat.canvas import Signature
    from pyrula_compat.result import AsyncResult, EagerResult


class Context:
    """``self.request``: what the running task knows about its call."""

    id: str | None = None
    args: Any = None
    kwargs: Any = None
    retries: int = 0
    is_eager: bool = False
    called_directly: bool = True
    eta: Any = None
    expires: Any = None
    hostname: str | None = None
    root_id: str | None = None
    parent_id: str | None = None
    group: str | None = None
    group_index: int | None = None
    chain: Any = None
    chord: Any = None
    callbacks: Any = None
    errbacks: Any = None
    headers: Any = None
    delivery_info: Any = None
    reply_to: str | None = None
    correlation_id: str | None = None
    origin: str | None = None
    timelimit: Any = None
    utc: bool = True
    ignore_result: bool = False
    task: str | None = None
    properties: Any = None
    shadow: str | None = None
    stamps: Any = None
    replaced_task_nesting: int = 0
    children: Any = None
    periodic_task_name: str | None = None

    _step: Any = None
    """The StepContext of the attempt, on a worker."""
    _retry: Retry | None = None
    """A retry asked for with ``throw=False`` (the attempt ends as a retry)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.update(*args, **kwargs)

    def update(self, *args: Any, **kwargs: Any) -> None:
        if not args and type(self) is Context:  # plain fields, no descriptors: at once
            self.__dict__.update(kwargs)
            return
        for source in (*args, kwargs):
            for key, value in dict(source).items():
                setattr(self, key, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def clear(self) -> None:
        self.__dict__.clear()

    def as_execution_options(self) -> dict[str, Any]:
        """The call options that send this request's task again (Celery's names)."""
        hard, soft = self.timelimit or (None, None)
        return {
            "task_id": self.id, "root_id": self.root_id, "parent_id": self.parent_id,
            "group_id": self.group, "group_index": self.group_index, "shadow": self.shadow,
            "chord": self.chord, "chain": self.chain, "link": self.callbacks,
            "link_error": self.errbacks, "expires": self.expires, "soft_time_limit": soft,
            "time_limit": hard, "headers": dict(self.headers or {}), "retries": self.retries,
            "reply_to": self.reply_to, "replaced_task_nesting": self.replaced_task_nesting,
            "origin": self.origin,
        }  # fmt: skip

    def __repr__(self) -> str:
        return f"<Context: {self.id} retries={self.retries} eager={self.is_eager}>"


class RequestStack(list[Context]):
    """``Task.request_stack``: the requests of this thread, innermost last (Celery's
    ``LocalStack``: ``top``, ``push``, ``pop``)."""

    @property
    def top(self) -> Context | None:
        return self[-1] if self else None

    def push(self, request: Context) -> None:
        self.append(request)


class AppProperty:
    """``Task.app``, read on the class or a task: the class's app, bound on first use
    to the current app when the class has none (as Celery's ``class_property``).
    Assigning it on a task binds the task's class (``Task.bind``)."""

    def __get__(self, task: Task | None, owner: type[Task] | None = None) -> Celery:
        if owner is None:
            assert task is not None
            owner = type(task)
        return owner._get_app()

    def __set__(self, task: Task, app: Celery) -> None:
        type(task).bind(app)


NO_STRATEGY = (
    "pyrula's worker claims runs from the store and runs them itself; to act around "
    "each run, override __call__ or before_start, or connect task_prerun"
)


class Task:
    """Base class of tasks. Decorator options become class attributes of a subclass."""

    name: str = ""
    # Left None (these descriptors), an attribute reads the app's setting, as the
    # attributes Celery's Task.bind fills from the configuration (app/from_config.py).
    typing: bool | None = from_config(STRICT_TYPING)
    max_retries: int | None = 3
    default_retry_delay: float = 180
    rate_limit: str | float | None = from_config("task_default_rate_limit")
    ignore_result: bool | None = from_config("task_ignore_result")
    store_eager_result: bool | None = from_config("task_store_eager_result")
    trail: bool = True
    send_events: bool = True
    store_errors_even_if_ignored: bool | None = from_config("task_store_errors_even_if_ignored")
    serializer: str | None = from_config("task_serializer")
    time_limit: float | None = from_config("task_time_limit")
    soft_time_limit: float | None = from_config("task_soft_time_limit")
    autoretry_for: tuple[type[BaseException], ...] = ()
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    retry_kwargs: dict[str, Any] = {}
    retry_backoff: bool | float = False
    retry_backoff_max: float = 600
    retry_jitter: bool = True
    acks_late: bool | None = from_config("task_acks_late")
    acks_on_failure_or_timeout: bool | None = from_config("task_acks_on_failure_or_timeout")
    acks_on_failure: bool | None = from_config("task_acks_on_failure")
    acks_on_timeout: bool | None = from_config("task_acks_on_timeout")
    reject_on_worker_lost: bool | None = from_config("task_reject_on_worker_lost")
    retry_on_worker_lost: bool | None = from_config("task_retry_on_worker_lost")
    track_started: bool | None = from_config("task_track_started")
    throws: tuple[type[BaseException], ...] = ()
    expires: float | datetime | None = None
    priority: int | None = from_config("task_default_priority")
    queue: str | None = None
    resultrepr_maxsize: int = 1024
    abstract: bool = True
    from_config: tuple[tuple[str, str], ...] = FROM_CONFIG
    """Task attribute -> the setting it reads when left None, as in Celery."""
    MaxRetriesExceededError = MaxRetriesExceededError
    OperationalError = OperationalError
    Request = Context
    Strategy = Unsupported("the worker's consumer strategy for kombu messages", NO_STRATEGY)
    start_strategy = Unsupported("how the worker's consumer starts a strategy", NO_STRATEGY)
    add_to_chord = Unsupported(
        "adding a task to the running chord's header",
        "a chord's header is fixed when it is sent; build the whole header first, or "
        "self.replace(chord(header, body)) to go on with a new chord",
    )

    _app: Celery | None = None
    __bound__: bool = False
    __class_getitem__: Any = classmethod(GenericAlias)  # ``Task[P, R]`` in annotations

    # -- identity ------------------------------------------------------------------------
    app = AppProperty()
    """The app the task belongs to; a class with none (a shared task's) reads the
    current app."""

    @classmethod
    def _get_app(cls) -> Celery:
        app = cls._app
        if app is None:  # a shared task follows the current app; nothing is frozen
            return _state.get_current_app()
        if not cls.__bound__:  # ``_app`` set on the class directly: bind on first use
            cls.bind(app)
        return app

    @classmethod
    def bind(cls, app: Celery | None) -> Celery | None:
        """Bind the task class to ``app`` (None: the current app, whichever it is),
        then call :meth:`on_bound`; returns ``app``, as in Celery. The attributes
        Celery's ``bind`` copies from the configuration read it on every use here."""
        cls._app = app
        cls.__bound__ = True
        if app is not None:
            cls.on_bound(app)
        return app

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        """Called when the class is bound to ``app`` (override in a base class)."""

    @classmethod
    def annotate(cls) -> None:
        """Apply the app's ``task_annotations`` for this task to its class."""
        from pyrula_compat.app.annotations import annotate

        app = cls._get_app()
        annotate(cls, app.conf.get("task_annotations"))

    @classmethod
    def add_around(cls, attr: str, around: Any) -> None:
        """Replace method ``attr`` by ``around(method)`` (the ``"@attr"`` annotations);
        wrapping again wraps the original, as in Celery."""
        original = getattr(cls, attr)
        original = getattr(original, "__wrapped__", None) or original
        method = around(original)
        method.__wrapped__ = original
        setattr(cls, attr, method)

    @property
    def backend(self) -> Any:
        """The app's result backend (the store): ``self.backend.store_result(...)``;
        assignable per task, as in Celery."""
        own = self.__dict__.get("_backend")
        return own if own is not None else self.app.backend

    @backend.setter
    def backend(self, value: Any) -> None:
        self.__dict__["_backend"] = value

    @property
    def __name__(self) -> str:
        cls: type = type(self)
        return cls.__name__

    def __repr__(self) -> str:
        return f"<@task: {self.name}>"

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """The task body; a decorated function replaces it."""
        raise NotImplementedError("Tasks must define the run method.")

    # -- the request --------------------------------------------------------------------
    def _stack(self) -> RequestStack:
        local = self.__dict__.get("_request_local")
        if local is None:
            local = self.__dict__.setdefault("_request_local", threading.local())
        stack: RequestStack | None = local.__dict__.get("stack")
        if stack is None:
            stack = local.__dict__["stack"] = RequestStack()
        return stack

    @property
    def request(self) -> Context:
        stack = self._stack()
        return stack[-1] if stack else Context()

    @property
    def request_stack(self) -> RequestStack:
        return self._stack()

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Push a request made of the current one updated with ``args``/``kwargs``, as
        Celery does (a ``__call__`` inside the worker keeps the worker's request)."""
        stack = self._stack()
        current = stack[-1].__dict__ if stack else {}
        stack.append(Context(*args, **{**current, **kwargs}))

    def pop_request(self) -> None:
        stack = self._stack()
        if stack:
            stack.pop()

    # -- calling ------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body here, as Celery's ``Task.__call__``: called directly
        (``request.called_directly``), or by the worker and eager mode when a class
        overrides ``__call__`` and calls ``super().__call__`` (or ``self.run``)."""
        _state.push_task(self)
        self.push_request(args=args, kwargs=kwargs)
        stack = self._stack()
        pushed = stack[-1]
        try:
            return self.run(*args, **kwargs)
        finally:
            self.pop_request()
            _state.pop_task()
            if pushed._retry is not None and stack:  # retry(throw=False): the attempt's
                stack[-1]._retry = pushed._retry

    def check_arguments(self, *args: Any, **kwargs: Any) -> None:
        """Raise TypeError when the arguments don't fit the body's signature, worded as
        Python words a call's error and naming the task: ``proj.add() got an unexpected
        keyword argument 'z'``, ``proj.add() missing 1 required positional argument:
        'y'``."""
        run = self.run
        body = getattr(run, "__func__", run)
        cached = self.__dict__.get("_signature_of")
        if cached is None or cached[0] is not body:  # computed once per body (patchable)
            try:
                signature: inspect.Signature | None = inspect.signature(run)
            except (TypeError, ValueError):
                signature = None
            cached = self.__dict__["_signature_of"] = (body, signature, set[Any]())
        signature, fits = cached[1], cached[2]
        # Whether arguments bind depends on their number and keyword names only: a
        # shape that bound once is not bound again.
        shape = (len(args), *kwargs) if kwargs else len(args)
        if signature is not None and shape not in fits:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                from pyrula_compat.calling import call_error

                raise TypeError(call_error(self.name, signature, args, kwargs, exc)) from None
            if len(fits) < 64:
                fits.add(shape)

    def _typing(self) -> bool:
        if self.typing is not None:
            return bool(self.typing)
        return bool(getattr(self.app, "strict_typing", True))

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Queue the task: ``apply_async(args, kwargs)``."""
        return self.apply_async(args, kwargs)

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Queue the task with Celery's options (``countdown``, ``eta``, ``expires``,
        ``task_id``, ``link``, ``link_error``, ``headers``; queue and priority are
        accepted and have no effect). Eager mode runs it here instead."""
        from pyrula_compat.calling import check_call

        check_call(self.name, args, kwargs, options)  # wrong types refused, nothing sent
        args = tuple(args or ())
        kwargs = dict(kwargs or {})
        if self._typing():
            self.check_arguments(*args, **kwargs)
        shadow = shadow or self.shadow_name(args, kwargs, options)
        if shadow:  # the worker's request.shadow: the name its logs show
            options["headers"] = {**dict(options.get("headers") or {}), "shadow": shadow}
        app = self.app
        if app.conf.task_always_eager:
            from pyrula_compat import eager

            if self.priority:
                options.setdefault("priority", self.priority)
            # Celery's eager apply_async sends args through the serializer and back.
            trip_args, trip_kwargs = eager.serialized(args, kwargs)
            return self.apply(
                trip_args, trip_kwargs, task_id=task_id or uuid(), link=link,
                link_error=link_error, **options,
            )  # fmt: skip
        if self.expires is not None:
            options.setdefault("expires", self.expires)
        from pyrula_compat import calling

        return calling.submit(
            app, self.name, args, kwargs, task_id=task_id, link=link, link_error=link_error,
            options=options, task=self,
        )  # fmt: skip

    def apply(
        self,
        args: Any = None,
        kwargs: Any = None,
        link: Any = None,
        link_error: Any = None,
        task_id: str | None = None,
        retries: int | None = None,
        throw: bool | None = None,
        logfile: Any = None,
        loglevel: Any = None,
        headers: Any = None,
        **options: Any,
    ) -> EagerResult:
        """Run the task here, now, and return an :class:`EagerResult` (no worker, no
        store). Retries run at once; a failure is captured unless ``throw`` or
        ``task_eager_propagates``."""
        from pyrula_compat import eager

        return eager.apply(
            self, args if args is not None else (), dict(kwargs or {}), task_id=task_id,
            link=link, link_error=link_error, retries=retries or 0, throw=throw,
            headers=headers, options=options, serialize=False,
        )  # fmt: skip

    def shadow_name(self, args: Any, kwargs: Any, options: Any) -> str | None:
        """Override to give a call another name in the worker's logs and
        ``request.shadow`` (None: the task's name)."""
        return None

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AsyncResult:
        from pyrula_compat.result import AsyncResult

        return AsyncResult(task_id, app=self.app, task_name=self.name, **kwargs)

    # -- signatures ---------------------------------------------------------------------
    def signature(self, args: Any = None, *starargs: Any, **starkwargs: Any) -> Signature:
        from pyrula_compat.canvas import Signature

        starkwargs.setdefault("app", self.app)
        return Signature(self, args, *starargs, **starkwargs)

    subtask = signature

    def signature_from_request(
        self,
        request: Context | None = None,
        args: Any = None,
        kwargs: Any = None,
        queue: str | None = None,
        **extra_options: Any,
    ) -> Signature:
        """The signature that sends the running request's task again (its id, root,
        parent, links, headers...), with ``args``/``kwargs`` replacing its own."""
        request = self.request if request is None else request
        args = request.args if args is None else args
        kwargs = request.kwargs if kwargs is None else kwargs
        options = {**request.as_execution_options(), **extra_options}
        if queue:
            options["queue"] = queue
        return self.signature(args, kwargs, options, **extra_options)

    subtask_from_request = signature_from_request

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        return self.signature(args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        return self.signature(args, kwargs, immutable=True)

    def chunks(self, it: Any, n: int) -> Any:
        from pyrula_compat.canvas import chunks

        return chunks(self.s(), it, n, app=self.app)

    def map(self, it: Any) -> Any:
        from pyrula_compat.canvas import xmap

        return xmap(self.s(), it, app=self.app)

    def starmap(self, it: Any) -> Any:
        from pyrula_compat.canvas import xstarmap

        return xstarmap(self.s(), it, app=self.app)

    # -- inside the body ----------------------------------------------------------------
    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: BaseException | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Run the task again later under the same id (Celery's semantics).

        No ``countdown``/``eta``: ``default_retry_delay``. Past ``max_retries`` retries
        (this call's value, else the task's; None = forever) ``exc`` is raised if given,
        else :class:`MaxRetriesExceededError`. Called directly (not by a worker or
        eagerly), it re-raises the exception being handled, or ``exc``.
        """
        request = self.request
        retries = request.retries + 1
        limit = self.max_retries if max_retries is None else max_retries
        if request.called_directly:
            _raise_with_context(exc or Retry("Task can be retried", None))
        if not eta and countdown is None:
            countdown = self.default_retry_delay
        new_args = request.args if args is None else args
        new_kwargs = request.kwargs if kwargs is None else kwargs
        if limit is not None and retries > limit:
            if exc is not None:
                _raise_with_context(exc)
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{new_args} kwargs:{new_kwargs}",
                task_args=new_args,
                task_kwargs=new_kwargs,
            )
        ret = Retry(
            exc=exc,
            when=eta or countdown,
            is_eager=request.is_eager,
            args_override=None if args is None else tuple(args),
            kwargs_override=None if kwargs is None else dict(kwargs),
        )
        if throw:
            raise ret
        if not request.is_eager:
            request._retry = ret  # the worker runs the task again after this attempt
        return ret

    def update_state(
        self, task_id: str | None = None, state: str | None = None, meta: Any = None, **kw: Any
    ) -> None:
        """Publish a custom state (``"PROGRESS"``) and ``meta``, readable elsewhere as
        ``AsyncResult(id).state`` / ``.info`` while the task runs. No effect in eager
        mode (as in Celery, the final state wins)."""
        request = self.request
        step = request._step if task_id in (None, request.id) else None
        if step is None:
            return
        from pyrula_compat import codec

        step.set_progress(state or states.PENDING, codec.to_json(meta))

    def add_trail(self, result: Any) -> Any:
        """Add ``result`` to this running task's ``children`` (Celery's ``add_trail``;
        tasks sent from the body are added already)."""
        from pyrula_compat import trail

        trail.add(result)
        return result

    def send_event(self, type_: str, retry: bool = True, **fields: Any) -> None:
        """Celery's task events feed Flower; pyrula has no event stream (no effect)."""

    def replace(self, sig: Any) -> Any:
        """Replace the rest of this task by ``sig``: its id gives ``sig``'s result, and
        its chain continues after ``sig``. Raises ``Ignore`` (code after it never runs);
        in eager mode ``sig`` runs here first. See :mod:`pyrula_compat.replace`."""
        from pyrula_compat import replace

        return replace.replace(self, sig)

    # -- hooks (override in a base class) ----------------------------------------------
    def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
        """Called before the body, in the worker."""

    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        """Called after the body returned."""

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Called when the task failed for good."""

    def on_retry(
        self, exc: BaseException | None, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Called when the task will be retried: ``exc`` is the exception given to
        ``retry()`` (None if none), ``einfo`` that of the ``Retry``."""

    def after_return(
        self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Called after the task succeeded or failed for good (not on a retry);
        ``einfo`` is None, as Celery's worker passes it."""

    def on_replace(self, sig: Any) -> Any:
        """Called by :meth:`replace` to run ``sig`` in this task's place; an override
        must return ``super().on_replace(sig)``, as in Celery."""
        from pyrula_compat import replace

        return replace.on_replace(self, sig)


def _raise_with_context(exc: BaseException) -> None:
    current = sys.exc_info()[1]
    if current is None:
        raise exc
    if current is exc:
        raise exc
    raise exc from current


__all__ = ["Context", "Task"]
