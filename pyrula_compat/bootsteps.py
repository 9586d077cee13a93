"""``celery.bootsteps``: user steps that start and stop with the worker.

A project adds step classes to its app, as with Celery::

    class Heartbeat(bootsteps.StartStopStep):
        def __init__(self, worker, **options):
            self.path = options.get("heartbeat_file") or "/tmp/worker-alive"

        def start(self, worker):
            ...  # open what the step serves

        def stop(self, worker):
            ...

    app.steps["worker"].add(Heartbeat)

``pyrula worker -A proj`` (and ``start_worker`` / the ``celery_worker`` fixture) makes
each step once the app is prepared (``Step(worker, **options)``: the worker is the
parent; ``options`` are the worker's ``hostname``, ``loglevel``, ``logfile``,
``concurrency`` and the values of the app's ``user_options['worker']``), then, the
store open and before the first task is claimed, starts the worker steps in the order
their ``requires`` give, then the consumer steps (``app.steps['consumer']``, whose
parent is :class:`Consumer`). At the stop it stops them in reverse order, consumer
steps first; an error while stopping is logged, as Celery does. A step whose
``start`` raises stops the worker's start with :class:`BootstepError`, naming the step
and the error (the steps started before it are stopped again).

Steps run in the worker's main process. Under ``--max-tasks-per-child`` (a supervisor
and its worker children) that is the supervisor, and the steps start once its first
child serves. A plain :class:`Step` is made and its ``create(parent)`` called, but not
started (as in Celery, only a :class:`StartStopStep` is). A :class:`ConsumerStep`
consumes kombu messages from a broker channel, which pyrula does not have: its start
raises, telling what to use instead.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from pyrula_compat.config import load_object

log = logging.getLogger("pyrula_compat.worker")

__all__ = ["Blueprint", "BootstepError", "ConsumerStep", "StartStopStep", "Step"]


class BootstepError(Exception):
    """A user bootstep could not be made or started; names the step and its error."""


class StepType(type):
    """The metaclass of steps: a step's ``name`` defaults to ``module.ClassName``."""

    name: str | None = None
    requires: Any = None

    def __new__(mcs, name: str, bases: tuple[type, ...], attrs: dict[str, Any]) -> StepType:
        module = attrs.get("__module__")
        qualified = f"{module}.{name}" if module else name
        attrs.update(__qualname__=qualified, name=attrs.get("name") or qualified)
        return super().__new__(mcs, name, bases, attrs)

    def __str__(cls) -> str:
        return str(cls.name)

    def __repr__(cls) -> str:
        return f"step:{cls.name}{{{cls.requires!r}}}"


class Step(metaclass=StepType):
    """A bootstep: made with the worker (its parent) as the worker starts."""

    name: str | None = None
    label: str | None = None
    conditional = False
    requires: tuple[Any, ...] = ()
    """Steps (classes or ``"module:Class"`` paths) of the same blueprint to start
    first."""
    last = False
    enabled = True

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        pass

    def include_if(self, parent: Any) -> bool:
        """Whether the step is included (default: :attr:`enabled`)."""
        return self.enabled

    def instantiate(self, name: Any, *args: Any, **kwargs: Any) -> Any:
        return load_object(name)(*args, **kwargs)

    def _should_include(self, parent: Any) -> tuple[bool, Any]:
        if self.include_if(parent):
            return True, self.create(parent)
        return False, None

    def include(self, parent: Any) -> bool:
        return self._should_include(parent)[0]

    def create(self, parent: Any) -> Any:
        """Create what the step manages (a :class:`StartStopStep` keeps it as ``obj``)."""

    @property
    def alias(self) -> str:
        return self.label or str(self.name).rsplit(".", 1)[-1]

    def info(self, obj: Any) -> Any:
        return None

    def __repr__(self) -> str:
        return f"<step: {self.alias}>"


class StartStopStep(Step):
    """A step started and stopped with the worker (its ``obj``'s, by default)."""

    obj: Any = None

    def start(self, parent: Any) -> Any:
        if self.obj:
            return self.obj.start()
        return None

    def stop(self, parent: Any) -> Any:
        if self.obj:
            return self.obj.stop()
        return None

    def close(self, parent: Any) -> None:
        pass

    def terminate(self, parent: Any) -> Any:
        if self.obj:
            return getattr(self.obj, "terminate", self.obj.stop)()
        return None

    def include(self, parent: Any) -> bool:
        included, made = self._should_include(parent)
        if included:
            self.obj = made
            parent.steps.append(self)
        return included


class ConsumerStep(StartStopStep):
    """Celery's step that consumes kombu messages; pyrula has no broker channel."""

    consumers: Any = None

    def get_consumers(self, channel: Any) -> Any:
        raise NotImplementedError("missing get_consumers")

    def start(self, c: Any) -> Any:
        raise BootstepError(
            f"ConsumerStep {self.name} consumes kombu messages from a broker channel, "
            "which pyrula does not have (tasks are runs in the store): send work as tasks "
            "(task.delay()), or make the step a StartStopStep that starts its own consumer"
        )


class Consumer:
    """The parent of the consumer steps (Celery's worker consumer): the app, the
    worker's node name, the worker (``controller``) and the started ``steps``."""

    def __init__(self, controller: Any) -> None:
        self.controller = controller
        self.app = controller.app
        self.hostname = controller.hostname
        self.steps: list[StartStopStep] = []


class Blueprint:
    """The user steps of one kind (``"worker"`` or ``"consumer"``), made for a parent
    and started and stopped with it."""

    def __init__(self, name: str, steps: Iterable[Any]) -> None:
        self.name = name
        self.types = [_step_class(step) for step in steps]
        self.order: list[Step] = []
        self.started: list[StartStopStep] = []

    def apply(self, parent: Any, **options: Any) -> Blueprint:
        """Make every step (``Step(parent, **options)``) in dependency order and let it
        include itself (a StartStopStep joins ``parent.steps``)."""
        for cls in _ordered(self.types):
            try:
                step = cls(parent, **options)
                self.order.append(step)
                step.include(parent)
            except Exception as exc:
                raise BootstepError(_failed(cls, "could not be made", exc)) from exc
        return self

    def start(self, parent: Any) -> None:
        for step in list(parent.steps):
            try:
                step.start(parent)
            except Exception as exc:
                raise BootstepError(_failed(type(step), "failed to start", exc)) from exc
            self.started.append(step)

    def stop(self, parent: Any) -> None:
        """Close then stop the started steps, in reverse order; errors are logged."""
        for method in ("close", "stop"):
            for step in reversed(self.started):
                try:
                    getattr(step, method)(parent)
                except Exception:
                    log.exception("bootstep %s: error on %s", step.name, method)
        self.started.clear()


def _step_class(step: Any) -> type[Step]:
    cls = load_object(step) if isinstance(step, str) else step
    if not (isinstance(cls, type) and issubclass(cls, Step)):
        raise BootstepError(
            f"{step!r} in app.steps is not a bootstep: subclass "
            "pyrula_compat.bootsteps.Step or StartStopStep (celery.bootsteps)"
        )
    return cls


def _ordered(types: list[type[Step]]) -> list[type[Step]]:
    """``types`` sorted so that each comes after what it ``requires`` (those of the
    same blueprint: Celery's own steps do not exist here), ties by name."""
    by_name = {str(cls.name): cls for cls in types}
    done: list[type[Step]] = []
    visiting: set[str] = set()

    def visit(cls: type[Step]) -> None:
        if cls in done:
            return
        if str(cls.name) in visiting:
            raise BootstepError(f"bootstep {cls.name} requires itself (a cycle)")
        visiting.add(str(cls.name))
        for required in cls.requires or ():
            found = _required(required, by_name)
            if found is not None:
                visit(found)
        done.append(cls)

    for cls in sorted(types, key=lambda c: str(c.name)):
        visit(cls)
    return done


def _required(required: Any, by_name: dict[str, type[Step]]) -> type[Step] | None:
    if isinstance(required, str):
        key = required.replace(":", ".")
        return by_name.get(key)
    return by_name.get(str(getattr(required, "name", "")))


def _failed(cls: type, what: str, exc: BaseException) -> str:
    name = getattr(cls, "name", None) or cls.__qualname__
    return f"bootstep {name} {what}: {type(exc).__name__}: {exc}"


class WorkerSteps:
    """The app's worker and consumer steps for one worker (``parent``)."""

    def __init__(self, parent: Any, steps: Any, **options: Any) -> None:
        self.parent = parent
        self.options = options
        if not hasattr(parent, "steps"):
            parent.steps = []
        self.worker = Blueprint("Worker", steps.get("worker", ()))
        self.consumer_parent = Consumer(parent)
        self.consumer = Blueprint("Consumer", steps.get("consumer", ()))
        self.worker.apply(parent, **options)
        self.consumer.apply(self.consumer_parent, **options)

    def start(self) -> None:
        """Start the worker steps, then the consumer steps; on an error, stop the ones
        started and raise :class:`BootstepError`."""
        try:
            self.worker.start(self.parent)
            self.consumer.start(self.consumer_parent)
        except BootstepError:
            self.stop()
            raise

    def stop(self) -> None:
        self.consumer.stop(self.consumer_parent)
        self.worker.stop(self.parent)
