"""``app.conf``: Celery's settings, by attribute or by key, with old names accepted.

Sources are read lazily, on the first read of any setting, so
``config_from_object("django.conf:settings", namespace="CELERY")`` in ``proj/celery.py``
does not import Django settings before Django is ready. Every setting is read when it
is used, never cached, so ``app.conf.task_always_eager = True`` at run time takes effect
on the next call.
"""

from __future__ import annotations

import copy
import importlib
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from pyrula_compat.exceptions import ImproperlyConfigured

log = logging.getLogger("pyrula_compat")

DEFAULTS: dict[str, Any] = {
    "accept_content": ["json"],
    "beat_schedule": {},
    "beat_scheduler": None,
    "broker_connection_retry_on_startup": None,
    "broker_transport_options": {},
    "broker_url": None,
    "enable_utc": True,
    "imports": (),
    "include": (),
    "result_accept_content": None,
    "result_backend": None,
    "result_expires": 86400,
    "result_extended": False,
    "result_serializer": "json",
    "task_acks_late": False,
    "task_always_eager": False,
    "task_annotations": None,
    "task_default_queue": "celery",
    "task_default_rate_limit": None,
    "task_eager_propagates": False,
    "task_ignore_result": False,
    "task_routes": None,
    "task_serializer": "json",
    "task_soft_time_limit": None,
    "task_store_eager_result": False,
    "task_time_limit": None,
    "task_track_started": False,
    "timezone": None,
    "worker_concurrency": None,
    "worker_hijack_root_logger": True,
    "worker_prefetch_multiplier": 4,
}

OLD_NAMES: dict[str, str] = {
    "BROKER_URL": "broker_url",
    "BROKER_TRANSPORT_OPTIONS": "broker_transport_options",
    "BROKER_CONNECTION_RETRY_ON_STARTUP": "broker_connection_retry_on_startup",
    "CELERY_ACCEPT_CONTENT": "accept_content",
    "CELERY_ACKS_LATE": "task_acks_late",
    "CELERY_ALWAYS_EAGER": "task_always_eager",
    "CELERY_ANNOTATIONS": "task_annotations",
    "CELERY_DEFAULT_QUEUE": "task_default_queue",
    "CELERY_DEFAULT_RATE_LIMIT": "task_default_rate_limit",
    "CELERY_EAGER_PROPAGATES_EXCEPTIONS": "task_eager_propagates",
    "CELERY_ENABLE_UTC": "enable_utc",
    "CELERY_IGNORE_RESULT": "task_ignore_result",
    "CELERY_IMPORTS": "imports",
    "CELERY_INCLUDE": "include",
    "CELERY_RESULT_BACKEND": "result_backend",
    "CELERY_RESULT_SERIALIZER": "result_serializer",
    "CELERY_ROUTES": "task_routes",
    "CELERY_TASK_RESULT_EXPIRES": "result_expires",
    "CELERY_TASK_SERIALIZER": "task_serializer",
    "CELERY_TIMEZONE": "timezone",
    "CELERY_TRACK_STARTED": "task_track_started",
    "CELERYBEAT_SCHEDULE": "beat_schedule",
    "CELERYBEAT_SCHEDULER": "beat_scheduler",
    "CELERYD_CONCURRENCY": "worker_concurrency",
    "CELERYD_HIJACK_ROOT_LOGGER": "worker_hijack_root_logger",
    "CELERYD_MAX_MEMORY_PER_CHILD": "worker_max_memory_per_child",
    "CELERYD_MAX_TASKS_PER_CHILD": "worker_max_tasks_per_child",
    "CELERYD_PREFETCH_MULTIPLIER": "worker_prefetch_multiplier",
    "CELERYD_TASK_SOFT_TIME_LIMIT": "task_soft_time_limit",
    "CELERYD_TASK_TIME_LIMIT": "task_time_limit",
    "CELERY_RESULT_EXTENDED": "result_extended",
}
"""Celery 3 setting names and their Celery 4+ names."""

ENV_OVERRIDES = {"broker_url": "CELERY_BROKER_URL", "result_backend": "CELERY_RESULT_BACKEND"}
"""Environment variables that override what the app passes, as in Celery."""


def new_name(key: str, namespace: str | None = None) -> str | None:
    """The setting ``key`` stands for, or None when it is not a setting here.

    With ``namespace`` (``"CELERY"``), only keys starting ``CELERY_`` count, with the
    prefix removed and the rest lower-cased (``CELERY_BROKER_URL`` -> ``broker_url``);
    old names are not read, as in Celery (``BROKER_URL`` and ``CELERYBEAT_SCHEDULE`` lack
    the prefix; ``CELERY_ALWAYS_EAGER`` would be ``always_eager``, which is no setting: a
    warning names the new one). Without a namespace, lower-case keys are taken as they
    are and old upper-case names mapped.
    """
    if namespace:
        prefix = namespace.rstrip("_") + "_"
        if not key.startswith(prefix):
            return None
        name = key[len(prefix) :].lower()
        if key in OLD_NAMES and OLD_NAMES[key] != name and name not in DEFAULTS:
            log.warning(
                "setting %s ignored: an old name, not read under namespace %r (as in "
                "Celery); write %s%s",
                key, namespace, prefix, OLD_NAMES[key].upper(),
            )  # fmt: skip
        return name
    if key in OLD_NAMES:
        return OLD_NAMES[key]
    if key.islower():
        return key
    return None


def _settings_of(obj: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping):
        yield from obj.items()
        return
    for key in dir(obj):
        if key.startswith("_"):
            continue
        try:
            yield key, getattr(obj, key)
        except Exception:  # a lazy Django setting that cannot be read: not ours
            continue


def load_object(source: Any) -> Any:
    """``"pkg.module"``, ``"pkg.module:attr"`` or ``"pkg.module.attr"``: import it."""
    if not isinstance(source, str):
        return source
    if ":" in source:
        module_name, attr = source.split(":", 1)
        return getattr(importlib.import_module(module_name), attr)
    try:
        return importlib.import_module(source)
    except ImportError:
        module_name, _, attr = source.rpartition(".")
        if not module_name:
            raise
        return getattr(importlib.import_module(module_name), attr)


class Settings(MutableMapping[str, Any]):
    """Celery's ``app.conf``: a mapping whose keys are also attributes."""

    def __init__(self, initial: Mapping[str, Any] | None = None) -> None:
        # Each app its own copies of the mutable defaults: add_periodic_task on one app
        # must not add the entry to every other app's beat_schedule.
        object.__setattr__(self, "_data", copy.deepcopy(DEFAULTS))
        object.__setattr__(self, "_changes", {})
        object.__setattr__(self, "_pending", [])
        object.__setattr__(self, "_preconf", set())
        if initial:
            self.update(initial)

    # -- sources -----------------------------------------------------------------------
    def preconfigure(self, key: str, value: Any) -> None:
        """A value the app was built with (``Celery(broker=...)``): a configuration
        source read later does not override it, as in Celery."""
        self._data[key] = value
        self._preconf.add(key)

    def add_source(self, source: Any, namespace: str | None, silent: bool) -> None:
        """Read ``source`` on the next access (``config_from_object``)."""
        self._pending.append((source, namespace, silent))

    def _load_pending(self) -> None:
        pending: list[tuple[Any, str | None, bool]] = self._pending
        while pending:
            source, namespace, silent = pending.pop(0)
            try:
                obj = load_object(source)
            except (ImportError, AttributeError) as exc:
                if silent:
                    continue
                raise ImproperlyConfigured(f"cannot load configuration {source!r}: {exc}") from exc
            for key, value in _settings_of(obj):
                name = new_name(key, namespace)
                if name is not None and name not in self._preconf and name not in self._changes:
                    self._data[name] = value

    # -- mapping -----------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if self._pending:  # read on every task call: skip the call when nothing waits
            self._load_pending()
        name = OLD_NAMES.get(key, key)
        if name in ENV_OVERRIDES:  # as in Celery, the environment wins over the app
            value = os.environ.get(ENV_OVERRIDES[name])
            if value:
                return value
        return self._data[name]

    def __setitem__(self, key: str, value: Any) -> None:
        self._load_pending()
        name = OLD_NAMES.get(key, key)
        self._data[name] = value
        self._changes[name] = value

    def __delitem__(self, key: str) -> None:
        self._load_pending()
        del self._data[OLD_NAMES.get(key, key)]

    def __iter__(self) -> Iterator[str]:
        self._load_pending()
        return iter(list(self._data))

    def __len__(self) -> int:
        self._load_pending()
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        self._load_pending()
        return isinstance(key, str) and OLD_NAMES.get(key, key) in self._data

    # -- attributes --------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"app.conf has no setting {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self[name] = value

    def __repr__(self) -> str:
        return f"<Settings: {len(self)} keys>"

    @property
    def changes(self) -> dict[str, Any]:
        """Settings changed at run time (``conf.X = Y`` or ``update``)."""
        return dict(self._changes)

    def humanize(self) -> str:
        return "\n".join(f"{key}: {self._data[key]!r}" for key in sorted(self))

    def find_option(self, name: str) -> Any:
        return self[name]
