"""``Celery``: the app object (``celery.Celery``), on one pyrula store."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import platform
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from pyrula.workflows.registry import Registry
from pyrula.workflows.sync import WorkflowClient
from pyrula_compat import _state, store
from pyrula_compat.app import localtz
from pyrula_compat.app.annotations import annotate, prepare
from pyrula_compat.app.configure import ConfigureSignal, add_periodic, periodic_entry
from pyrula_compat.app.control import Control
from pyrula_compat.app.from_config import fill_from_config, own_value
from pyrula_compat.app.log import Logging
from pyrula_compat.app.registry import (  # noqa: F401  (shared_task: Celery's path too)
    TaskRegistry,
    _django_apps,
    _import_if_exists,
    build_task,
    parse_rate,
    shared_task,
)
from pyrula_compat.app.task import Task as TaskBase
from pyrula_compat.app.unsupported import BrokerAttributes
from pyrula_compat.config import Settings, load_object
from pyrula_compat.exceptions import ImproperlyConfigured
from pyrula_compat.signals import Signal

log = logging.getLogger("pyrula_compat")

SERIALIZER_KEYS = (
    "task_serializer",
    "result_serializer",
    "accept_content",
    "result_accept_content",
)
JSON_NAMES = frozenset({"json", "application/json"})
DEFAULT_TASK_CLS = "pyrula_compat.app.task:Task"
DJANGO_TASK_CLS = "pyrula_compat.contrib.django.task:DjangoTask"


def task_class(value: Any, what: str) -> type[TaskBase]:
    """``value`` (a class or a ``"module:Class"`` path) as a Task subclass; anything
    else is a TypeError naming it and ``what`` it was given as."""
    cls = load_object(value) if isinstance(value, str) else value
    if not (isinstance(cls, type) and issubclass(cls, TaskBase)):
        raise TypeError(
            f"{what}={value!r}: a task base class must subclass "
            "pyrula_compat.Task (celery.Task), as in `class MyTask(app.Task): ...`"
        )
    return cls


class Celery(BrokerAttributes):
    """A Celery app whose queue, results and schedules live in one pyrula store.

    ``broker`` picks the store (see :mod:`pyrula_compat.store`); ``backend`` may name
    the same server or be left out. Extra keyword arguments become settings.
    ``task_cls`` (a Task subclass or ``"module:Class"``) is the base of the app's
    tasks, as is a class assigned to ``app.Task`` later.
    """

    SYSTEM = "pyrula"
    IS_macOS = platform.system() == "Darwin"
    IS_WINDOWS = platform.system() == "Windows"
    registry_cls = TaskRegistry
    builtin_fixups = frozenset({"pyrula_compat.contrib.django"})
    """Celery's Django fix-up: with ``DJANGO_SETTINGS_MODULE`` set the worker sets
    Django up and runs its checks, and tasks default to ``DjangoTask``."""
    backend_cls: Any = None

    def __init__(
        self,
        main: str | None = None,
        loader: Any = None,
        backend: str | None = None,
        amqp: Any = None,
        events: Any = None,
        log: Any = None,
        control: Any = None,
        set_as_current: bool = True,
        tasks: Any = None,
        broker: str | None = None,
        include: Iterable[str] | None = None,
        changes: Mapping[str, Any] | None = None,
        config_source: Any = None,
        fixups: Any = None,
        task_cls: type[TaskBase] | str | None = None,
        autofinalize: bool = True,
        namespace: str | None = None,
        strict_typing: bool = True,
        **kwargs: Any,
    ) -> None:
        self.main = main
        self.namespace = namespace
        self.strict_typing = strict_typing
        self.set_as_current = set_as_current
        self.autofinalize = autofinalize
        self.loader_cls: Any = loader or os.environ.get("CELERY_LOADER") or "app"
        self.control_cls: Any = control or "pyrula_compat.app.control:Control"
        self.log_cls: Any = log or "pyrula_compat.app.log:Logging"
        self.fixups = set(self.builtin_fixups) if fixups is None else set(fixups)
        self.use_fast_trace_task = False
        self.steps: defaultdict[str, set[Any]] = defaultdict(set)
        """User bootsteps: ``app.steps['worker'].add(MyStep)`` (and ``'consumer'``),
        started and stopped with the worker (:mod:`pyrula_compat.bootsteps`)."""
        self.user_options: defaultdict[str, set[Any]] = defaultdict(set)
        """``app.user_options['worker'].add(click.Option(...))``: options of ``pyrula
        worker -A`` whose values reach the worker's bootsteps."""
        self.conf = Settings()
        if broker:
            self.conf.preconfigure("broker_url", broker)
        if backend:
            self.conf.preconfigure("result_backend", backend)
        if include:
            self.conf.preconfigure("include", tuple(include))
        for key, value in {**dict(changes or {}), **kwargs}.items():
            self.conf.preconfigure(key, value)
        if config_source is not None:
            self.config_from_object(config_source)
        if task_cls is None and "DJANGO_SETTINGS_MODULE" in os.environ:
            task_cls = DJANGO_TASK_CLS
        if task_cls is not None and not isinstance(task_cls, str):
            task_class(task_cls, "task_cls")  # a wrong class fails here; a path when used
        self.task_cls: type[TaskBase] | str = task_cls or DEFAULT_TASK_CLS
        self._tasks = TaskRegistry()
        self.registry = Registry()
        """The pyrula workflows of this app's tasks: what ``pyrula worker -A`` serves."""
        self.control = Control(self)
        self._autodiscover: list[tuple[Any, str]] = []
        self._pending_periodic: list[tuple[str, dict[str, Any], str | None]] = []
        self._pending_defaults: list[Callable[[], Any]] = []
        self._served_rates: dict[str, Any] = {}
        self._client_lock = threading.Lock()
        self._client_key: tuple[Any, ...] | None = None
        self._client: WorkflowClient | None = None
        self.on_configure = Signal("on_configure")
        self.on_after_configure = ConfigureSignal("on_after_configure", self.conf)
        self.conf.on_load(self._configuring, self._configured)
        self.on_after_finalize = Signal("on_after_finalize")
        self.on_after_fork = Signal("on_after_fork")
        self.finalized = False
        from pyrula_compat import canvas_flows

        for definition in canvas_flows.make_canvas_workflows(self, self.registry):
            store.compat_registry.register(definition)
        from pyrula_compat import notices

        notices.make_notice_workflow(self, self.registry)  # task_revoked of queued tasks
        self._add_builtin_tasks()
        self.on_init()
        _state.register_app(self)
        if set_as_current:
            _state.set_current_app(self)

    def on_init(self) -> None:
        """Called at the end of ``__init__`` (override in a subclass)."""

    def __repr__(self) -> str:
        return f"<Celery {self.main or '__main__'} at {id(self):#x}>"

    def __reduce__(self) -> Any:
        raise TypeError("a Celery app is not picklable; refer to it by module path")

    # -- configuration -------------------------------------------------------------------
    @property
    def configured(self) -> bool:
        """Whether the configuration was loaded (the first read of ``app.conf``)."""
        return self.conf.configured

    def _configuring(self) -> None:
        self.on_configure.send(sender=self)

    def _configured(self) -> None:
        """The configuration was loaded (the first read of a setting, in any process): as
        Celery's ``_load_config``, apply ``add_defaults`` and ``add_periodic_task`` calls
        made before, then send ``on_after_configure``. Tasks registered before read their
        annotations and rate limits now."""
        while self._pending_defaults:
            self.conf.add_defaults(dict(self._pending_defaults.pop(0)()))
        while self._pending_periodic:
            add_periodic(self, *self._pending_periodic.pop(0))
        self._apply_settings_to_tasks()
        self.on_after_configure.fire(sender=self, source=self.conf)

    def config_from_object(
        self, obj: Any, silent: bool = False, force: bool = False, namespace: str | None = None
    ) -> None:
        """Read settings from a module path, ``"module:attr"``, an object or a dict,
        lazily (on the first read of a setting; ``force``: now). With
        ``namespace="CELERY"``, ``CELERY_BROKER_URL`` is ``broker_url``. A source that
        does not import raises its ``ImportError`` then, unless ``silent``."""
        self.namespace = namespace or self.namespace
        self.conf.add_source(obj, namespace, silent)
        if force:
            self.conf.load(strict=True)

    def config_from_envvar(
        self, variable_name: str, silent: bool = False, force: bool = False
    ) -> None:
        module_name = os.environ.get(variable_name)
        if not module_name:
            if silent:
                return
            raise ImproperlyConfigured(f"environment variable {variable_name!r} is not set")
        self.config_from_object(module_name, silent=silent, force=force)

    def add_defaults(self, fun: Any) -> None:
        """Defaults under every other source: a dict, or a callable returning one (called
        when the configuration loads)."""
        values = fun
        loader: Callable[[], Any] = fun if callable(fun) else (lambda: values)
        if self.conf.configured:
            self.conf.add_defaults(dict(loader()))
        else:
            self._pending_defaults.append(loader)

    @property
    def timezone(self) -> tzinfo:
        """``conf.timezone``, else UTC, or with ``enable_utc`` off the machine's local
        time zone (:func:`~pyrula_compat.app.localtz.local_zone`), as in Celery."""
        name = self.conf.timezone
        if name:
            return name if isinstance(name, tzinfo) else ZoneInfo(str(name))
        if self.conf.enable_utc:
            return ZoneInfo("UTC")
        return localtz.local_zone()

    def timezone_name(self) -> str:
        """The name of :attr:`timezone` (what crontab schedules are read in)."""
        name = self.conf.timezone
        return name if name and isinstance(name, str) else localtz.zone_name(self.timezone)

    def now(self) -> datetime:
        return datetime.now(UTC).astimezone(self.timezone)

    def check_serializers(self) -> None:
        """Refuse settings that ask for pickle, yaml or msgpack: pyrula stores JSON."""
        for key in SERIALIZER_KEYS:
            value = self.conf.get(key)
            if value is None:
                continue
            names = [value] if isinstance(value, str) else list(value)
            bad = [n for n in names if str(n).lower() not in JSON_NAMES]
            if bad:
                raise ImproperlyConfigured(
                    f"{key}={value!r}: pyrula stores task arguments and results as JSON "
                    f"only, never {', '.join(map(str, bad))}; set {key} to 'json' (or "
                    "['json']) and pass JSON-able arguments (ids, not objects)"
                )

    # -- the store ----------------------------------------------------------------------
    def store_url(self) -> str | None:
        """The store URL from the broker and result backend settings (env vars win)."""
        return store.store_url(self.conf.broker_url, self.conf.result_backend)

    def client(self) -> WorkflowClient:
        """The process's blocking client for this app's store (created on first use)."""
        key = (self.conf.broker_url, self.conf.result_backend)
        client = self._client
        if client is not None and key == self._client_key:
            return client
        with self._client_lock:
            if self._client is None or key != self._client_key:
                self.check_serializers()
                self._client = store.client_for(self.store_url())
                self._client_key = key
            return self._client

    def close(self) -> None:
        self._client = None

    @functools.cached_property
    def log(self) -> Logging:
        """``app.log``: the worker's logging set-up, an instance of ``log_cls``
        (:class:`pyrula_compat.app.log.Logging`, or the class given as ``Celery(log=)``)."""
        from pyrula_compat.utils.imports import symbol_by_name

        made: Logging = symbol_by_name(self.log_cls)(self)
        return made

    # -- tasks -------------------------------------------------------------------------
    @property
    def tasks(self) -> TaskRegistry:
        if not self.finalized:
            self.finalize(auto=True)
        return self._tasks

    @property
    def Task(self) -> type[TaskBase]:
        """The base class of the tasks this app creates: ``task_cls`` bound to this app
        (``class ContextTask(app.Task)`` belongs to it). Assign a Task subclass
        (``app.Task = ContextTask``) to change it for the tasks created afterwards."""
        cls = self.__dict__.get("_task_base")
        if cls is None:
            cls = self.__dict__["_task_base"] = self.create_task_cls()
        return cls

    @Task.setter
    def Task(self, cls: type[TaskBase]) -> None:
        self.__dict__["_task_base"] = task_class(cls, "app.Task")

    def create_task_cls(self) -> type[TaskBase]:
        """``task_cls`` subclassed and bound to this app (what ``app.Task`` is)."""
        base = task_class(self.task_cls, "task_cls")
        return self.subclass_with_self(base, name="Task", attribute="_app", abstract=True)

    def subclass_with_self(
        self,
        Class: Any,
        name: str | None = None,
        attribute: str = "app",
        reverse: str | None = None,
        keep_reduce: bool = False,
        **kw: Any,
    ) -> type:
        """A subclass of ``Class`` (or the ``"module:Class"`` it names) whose
        ``attribute`` is this app."""
        cls = load_object(Class) if isinstance(Class, str) else Class
        attrs = {attribute: self, "__module__": cls.__module__, "__doc__": cls.__doc__, **kw}
        return type(name or cls.__name__, (cls,), attrs)

    @property
    def annotations(self) -> list[Any]:
        """``task_annotations`` prepared: a list of annotation objects."""
        return prepare(self.conf.get("task_annotations"))

    @property
    def current_task(self) -> TaskBase | None:
        """The task whose body runs in this thread, or None."""
        return _state.get_current_task()

    @property
    def current_worker_task(self) -> TaskBase | None:
        """The innermost task run by a worker (not called directly) in this thread."""
        return _state.get_current_worker_task()

    def gen_task_name(self, name: str, module: str) -> str:
        if module == "__main__" and self.main:
            return f"{self.main}.{name}"
        return f"{module}.{name}" if module else name

    def task(self, *args: Any, **opts: Any) -> Any:
        """``@app.task`` or ``@app.task(name=..., bind=True, ...)``."""
        if len(args) == 1 and callable(args[0]):
            return self._task_from_fun(args[0], **opts)

        def decorate(fun: Callable[..., Any]) -> TaskBase:
            return self._task_from_fun(fun, **opts)

        if args:
            raise TypeError("@app.task takes keyword options only")
        return decorate

    def _task_from_fun(
        self,
        fun: Callable[..., Any],
        name: str | None = None,
        base: type[TaskBase] | None = None,
        bind: bool = False,
        shared: bool = False,
        **options: Any,
    ) -> TaskBase:
        name = name or self.gen_task_name(fun.__name__, fun.__module__)
        existing = self._tasks._tasks.get(name)
        if existing is not None and getattr(existing, "__wrapped__", None) is fun:
            return existing
        base = task_class(base, "base") if base is not None else self.Task
        task = build_task(fun, name, base, bind, {**options, "_shared": shared})
        self.register_task(task)
        return task

    def register_task(self, task: TaskBase | type[TaskBase], **options: Any) -> TaskBase:
        """Add ``task`` (a Task subclass or its instance; named after its class if it
        has no name) to this app, bind it to the app (a shared task keeps following
        the current app) and serve it as the workflow of the same name."""
        if isinstance(task, type):
            task = task_class(task, "register_task")()
        if not task.name:
            cls: type = type(task)
            task.name = self.gen_task_name(cls.__name__, cls.__module__)
        type(task).bind(None if getattr(task, "_shared", False) else self)
        fill_from_config(task)
        conf = self.conf  # registering loads no configuration: it applies when loaded
        annotate(
            task, conf.get("task_annotations") if conf.configured else conf.peek("task_annotations")
        )
        self._tasks.register(task)
        self._serve(task)
        return task

    def _serve(self, task: TaskBase, only_if_changed: bool = False) -> None:
        """Serve ``task`` as the workflow of its name, under its rate limit (its own, else
        ``task_default_rate_limit`` once the configuration is loaded)."""
        from pyrula_compat import flows

        conf = self.conf
        default = conf.get if conf.configured else conf.peek
        rate = parse_rate(own_value(task, "rate_limit") or default("task_default_rate_limit"))
        if only_if_changed and self._served_rates.get(task.name, rate) == rate:
            return
        self._served_rates[task.name] = rate
        definition = flows.make_task_workflow(self, task.name, self.registry, rate)
        store.compat_registry.register(definition)

    def _apply_settings_to_tasks(self) -> None:
        """Annotations, and rate limits from them or ``task_default_rate_limit``, of the
        tasks registered before the configuration loaded (or before they were set)."""
        setting = self.conf.get("task_annotations")
        for task in list(self._tasks._tasks.values()):
            if setting:
                annotate(task, setting)
            self._serve(task, only_if_changed=True)

    def finalize(self, auto: bool = False) -> None:
        """Apply the settings to the tasks registered so far and send
        ``on_after_finalize``; done on the first read of ``app.tasks`` unless the app
        was made with ``autofinalize=False`` (then that read raises RuntimeError)."""
        if self.finalized:
            return
        if auto and not self.autofinalize:
            raise RuntimeError("Contract breach: app not finalized (autofinalize=False)")
        self.finalized = True
        # Annotations set after tasks were registered (shared tasks are, as an app is
        # made) apply now, as Celery applies them when it finalizes.
        self._apply_settings_to_tasks()
        self.on_after_finalize.send(sender=self)

    def _add_builtin_tasks(self) -> None:
        def celery_map(task: str, it: list[Any]) -> list[Any]:
            return [self.tasks[task](item) for item in it]

        def celery_starmap(task: str, it: list[Any]) -> list[Any]:
            return [self.tasks[task](*item) for item in it]

        def celery_chunks(bound: TaskBase, task: Any, it: list[Any], n: int) -> Any:
            from pyrula_compat import replace

            return replace.run_chunks(bound, task, it, n)

        def celery_accumulate(*args: Any, **kwargs: Any) -> Any:
            index = kwargs.get("index")
            return args[index] if index is not None else args

        # On Task itself: task_cls may name a module that imports this app's module.
        self._task_from_fun(celery_map, name="celery.map", base=TaskBase)
        self._task_from_fun(celery_starmap, name="celery.starmap", base=TaskBase)
        self._task_from_fun(celery_chunks, name="celery.chunks", bind=True, base=TaskBase)
        self._task_from_fun(celery_accumulate, name="celery.accumulate", base=TaskBase)

    def autodiscover_tasks(
        self, packages: Any = None, related_name: str = "tasks", force: bool = False
    ) -> None:
        """Import ``<package>.tasks`` for each package (Django: each installed app),
        when the worker starts (or now with ``force``). Missing modules are skipped."""
        self._autodiscover.append((packages, related_name))
        if force:
            self.import_autodiscovered()

    def import_autodiscovered(self) -> list[str]:
        imported: list[str] = []
        pending, self._autodiscover = self._autodiscover, []
        for packages, related_name in pending:
            names = packages() if callable(packages) else packages
            if names is None:
                names = _django_apps()
            for package in names or ():
                module = f"{package}.{related_name}" if related_name else package
                if _import_if_exists(module):
                    imported.append(module)
        return imported

    def import_default_modules(self) -> list[str]:
        """Import ``include`` and ``imports`` modules and autodiscovered task modules."""
        modules = [*tuple(self.conf.include or ()), *tuple(self.conf.imports or ())]
        for module in modules:
            importlib.import_module(module)
        return modules + self.import_autodiscovered()

    # -- calling by name ----------------------------------------------------------------
    def send_task(
        self,
        name: str,
        args: Any = None,
        kwargs: Any = None,
        countdown: float | None = None,
        eta: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        connection: Any = None,
        router: Any = None,
        result_cls: Any = None,
        expires: Any = None,
        link: Any = None,
        link_error: Any = None,
        **options: Any,
    ) -> Any:
        """Queue task ``name`` without importing it. A name no worker knows stays
        queued (PENDING) until a worker that knows it starts; it is never dropped."""
        from pyrula_compat import calling

        if name not in self._tasks._tasks:
            log.info(
                "send_task(%r): not registered here; it waits for a worker that knows it", name
            )
        options.update(countdown=countdown, eta=eta, expires=expires)
        return calling.submit(
            self, name, args, kwargs, task_id=task_id, link=link, link_error=link_error,
            options={k: v for k, v in options.items() if v is not None},
        )  # fmt: skip

    @property
    def backend(self) -> Any:
        """The result backend (:class:`~pyrula_compat.backend.Backend`): the store."""
        from pyrula_compat.backend import Backend

        backend = self.__dict__.get("_backend")
        if backend is None:
            backend = self.__dict__["_backend"] = Backend(self)
        return backend

    def AsyncResult(self, task_id: str, **kwargs: Any) -> Any:
        from pyrula_compat.result import AsyncResult

        return AsyncResult(task_id, app=self, **kwargs)

    @property
    def GroupResult(self) -> Any:
        """``GroupResult`` bound to this app, as Celery's: ``app.GroupResult(id, results)``
        and ``app.GroupResult.restore(id)``."""
        bound = self.__dict__.get("_group_result")
        if bound is None:
            bound = self.__dict__["_group_result"] = _bound_group_result(self)
        return bound

    def signature(self, *args: Any, **kwargs: Any) -> Any:
        from pyrula_compat.canvas import signature

        kwargs["app"] = self
        return signature(*args, **kwargs)

    # -- beat ----------------------------------------------------------------------------
    def add_periodic_task(
        self,
        schedule: Any,
        sig: Any,
        args: Any = (),
        kwargs: Any = (),
        name: str | None = None,
        **opts: Any,
    ) -> str:
        """Add a ``beat_schedule`` entry (synced to the store when the worker starts) under
        ``name``, else ``repr`` of the signature, as Celery names it. Before the
        configuration is loaded, the entry is added when it is."""
        key, entry = periodic_entry(self, schedule, sig, args, kwargs, name, opts)
        if self.conf.configured:
            add_periodic(self, key, entry, name)
        else:
            self._pending_periodic.append((key, entry, name))
        return key

    # -- current -----------------------------------------------------------------------
    def set_current(self) -> None:
        """Make this the current app (``current_app``, shared tasks' app)."""
        _state.set_current_app(self)

    def set_default(self) -> None:
        """Make this the default app, and the current one."""
        _state.set_default_app(self)
        _state.set_current_app(self)

    # -- what Celery's app also offers ---------------------------------------------------
    @property
    def loader(self) -> Any:
        """``app.loader``: an instance of ``loader_cls`` (:mod:`pyrula_compat.loaders`),
        whose worker hooks the worker calls."""
        loader = self.__dict__.get("_loader")
        if loader is None:
            from pyrula_compat.loaders import get_loader_cls

            loader = self.__dict__["_loader"] = get_loader_cls(self.loader_cls)(app=self)
        return loader

    @property
    def ResultSet(self) -> type:
        from pyrula_compat.result import ResultSet

        return self.subclass_with_self(ResultSet, attribute="_app")

    def either(self, default_key: str, *defaults: Any) -> Any:
        """The setting ``default_key``, else the first of ``defaults`` not None."""
        for value in (self.conf.get(default_key), *defaults):
            if value is not None:
                return value
        return None

    @property
    def oid(self) -> str:
        """A unique id of this app in this process."""
        value = self.__dict__.get("_oid")
        if value is None:
            value = self.__dict__["_oid"] = str(uuid.uuid4())
        return value

    @property
    def thread_oid(self) -> str:
        """A unique id of this app in this thread."""
        local = self.__dict__.setdefault("_thread_oids", threading.local())
        if not hasattr(local, "oid"):
            local.oid = str(uuid.uuid4())
        return local.oid  # type: ignore[no-any-return]

    def prepare_config(self, c: Any) -> Any:
        """Called with the configuration as it loads; returns it (override to change)."""
        return c

    def config_from_cmdline(self, argv: Iterable[str], namespace: str = "celery") -> None:
        """Settings from ``key=value`` strings (``celery.task_always_eager=(bool)1``)."""
        self.conf.update(self.loader.cmdline_config_parser(argv, namespace))

    def uses_utc_timezone(self) -> bool:
        return self.timezone_name() in ("UTC", "Etc/UTC")

    def type_checker(self, fun: Callable[..., Any], bound: bool = False) -> Callable[..., None]:
        """A function that raises TypeError when called with arguments ``fun`` does not
        take (its ``self`` left out when ``bound``)."""
        import inspect

        signature = inspect.signature(fun)
        if bound:
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)

        def check(*args: Any, **kwargs: Any) -> None:
            signature.bind(*args, **kwargs)

        return check

    def bugreport(self) -> str:
        """Versions and the settings' origin, for a bug report (as ``celery report``)."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            pyrula_version = version("pyrula")
        except PackageNotFoundError:
            pyrula_version = "unknown"
        return (
            f"software -> pyrula_compat (pyrula {pyrula_version}) "
            f"py:{platform.python_version()}\nplatform -> system:{platform.system()} "
            f"arch:{platform.machine()}\nloader -> {self.loader_cls}\n"
            f"settings -> broker_url:{self.conf.broker_url!r}"
        )

    def __enter__(self) -> Celery:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _bound_group_result(bound_app: Celery) -> type:
    from pyrula_compat.result import GroupResult

    class AppGroupResult(GroupResult):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("app", bound_app)
            super().__init__(*args, **kwargs)

        @classmethod
        def restore(
            cls, id: str, backend: Any = None, app: Celery | None = None
        ) -> GroupResult | None:
            return GroupResult.restore(id, backend, app if app is not None else bound_app)

    AppGroupResult.__name__ = AppGroupResult.__qualname__ = "GroupResult"
    return AppGroupResult
