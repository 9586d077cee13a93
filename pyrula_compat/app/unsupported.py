"""Celery attributes that have no meaning on a durable store.

``Task`` and ``Celery`` list every public attribute of Celery's classes. The few tied to
a message broker (kombu connections, producers, consumer strategies, AMQP queues) or to
pickling cannot apply: pyrula keeps tasks as runs in its store and never unpickles.
Each of those is an :class:`Unsupported` class attribute, which raises
``AttributeError`` naming the Celery feature and what to use instead, the moment it is
read (``hasattr`` says False, as for a missing attribute)."""

from __future__ import annotations

from typing import Any, NoReturn


class Unsupported:
    """A class attribute whose every read raises AttributeError with ``feature`` (what
    the attribute is in Celery) and ``instead`` (what to use with pyrula_compat)."""

    def __init__(self, feature: str, instead: str) -> None:
        self.feature = feature
        self.instead = instead
        self.name = ""
        self.owner = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner.__name__

    def message(self, owner: str = "") -> str:
        return (
            f"{owner or self.owner}.{self.name} is {self.feature} in Celery, which "
            f"pyrula_compat does not have: {self.instead}"
        )

    def __get__(self, obj: Any, owner: type | None = None) -> NoReturn:
        cls = owner if owner is not None else type(obj)
        label = str(getattr(cls, "_celery_class_name", "") or self.owner)
        raise AttributeError(self.message(label), name=self.name, obj=obj)


__all__ = ["Unsupported"]


STORE = (
    "pyrula has no broker: tasks are runs in the store named by broker_url; send with "
    "task.delay()/apply_async() or app.send_task(), check the store with "
    "app.control.ping() or `pyrula status`"
)
WORKER = (
    "run `pyrula worker -A proj` (a process), or in tests and scripts "
    "pyrula_compat.contrib.testing.worker.start_worker(app) (a thread)"
)


class BrokerAttributes:
    """The ``Celery`` attributes for Celery's broker, its embedded worker and beat
    classes, and pickling: none exists in pyrula (see :class:`Unsupported`)."""

    _celery_class_name = "Celery"
    """How the messages name the class (the mixin is not what users know)."""

    amqp = Unsupported("the AMQP layer (app.amqp: queues, routes, producers)", STORE)
    amqp_cls = Unsupported("the class of app.amqp", STORE)
    broker_connection = Unsupported("a kombu connection to the broker", STORE)
    connection = Unsupported("a kombu connection to the broker", STORE)
    connection_for_read = Unsupported("a kombu connection to consume from", STORE)
    connection_for_write = Unsupported("a kombu connection to publish with", STORE)
    connection_or_acquire = Unsupported("a kombu connection from the app's pool", STORE)
    default_connection = Unsupported("a kombu connection from the app's pool", STORE)
    default_producer = Unsupported("a kombu producer from the app's pool", STORE)
    producer_or_acquire = Unsupported("a kombu producer from the app's pool", STORE)
    producer_pool = Unsupported("the app's pool of kombu producers", STORE)
    pool = Unsupported("the app's pool of broker connections", STORE)
    select_queues = Unsupported(
        "selecting the AMQP queues a worker consumes",
        "pyrula has one queue per store and every worker serves every task it imports",
    )
    events = Unsupported(
        "the event stream (Flower, celery events)",
        "watch runs with `pyrula runs list` / `pyrula dashboard`, or connect the task "
        "signals (task_prerun, task_success, task_failure)",
    )
    events_cls = Unsupported("the class of app.events", "see app.events")
    setup_security = Unsupported(
        "message signing (the auth serializer)",
        "pyrula stores JSON in a store only it reaches; secure the store's connection "
        "(rediss://, file permissions) instead",
    )
    Pickler = Unsupported(
        "pickling an app to send it to a process",
        "pyrula never pickles; a process imports the app by its module path (-A proj)",
    )
    start = Unsupported("running Celery's command line in this process", WORKER)
    worker_main = Unsupported("running Celery's worker command in this process", WORKER)
    Worker = Unsupported("the embeddable worker application", WORKER)
    WorkController = Unsupported("the embeddable worker", WORKER)
    Beat = Unsupported(
        "the embeddable beat service",
        "every `pyrula worker -A proj` fires beat_schedule, or run `pyrula beat -A proj`",
    )


__all__ += ["BrokerAttributes"]
