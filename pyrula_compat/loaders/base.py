"""``app.loader`` (``celery.loaders.base.BaseLoader``): importing task modules and the
worker's start-up and shutdown hooks.

The worker calls ``init_worker()`` as it prepares the app (which imports the default
modules once, then calls :meth:`BaseLoader.on_worker_init`) and ``shutdown_worker()``
as it stops, so a custom loader (``Celery(loader=MyLoader)``) gets Celery's hooks. The
configuration itself is the app's (``app.conf``): ``loader.conf`` reads the module named
by ``CELERY_CONFIG_MODULE`` when it is set, as Celery's does.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pyrula_compat.config import load_object

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

_UNREAD = object()


class BaseLoader:
    """What Celery's loaders do that a project's code calls or overrides."""

    builtin_modules: frozenset[str] = frozenset()
    configured = False
    override_backends: dict[str, Any] = {}
    worker_initialized = False

    def __init__(self, app: Celery, **kwargs: Any) -> None:
        self.app = app
        self.task_modules: set[str] = set()
        self._conf: Any = _UNREAD

    def now(self, utc: bool = True) -> datetime:
        return datetime.now(UTC) if utc else datetime.now()

    # -- hooks (override in a loader class) ---------------------------------------------
    def on_task_init(self, task_id: str, task: Any) -> None:
        """Called before a task is executed."""

    def on_process_cleanup(self) -> None:
        """Called after a task is executed."""

    def on_worker_init(self) -> None:
        """Called when the worker starts (``pyrula worker -A``, ``start_worker``)."""

    def on_worker_shutdown(self) -> None:
        """Called when the worker stops."""

    def on_worker_process_init(self) -> None:
        """Called when a worker child process starts."""

    # -- imports ------------------------------------------------------------------------
    def import_module(self, module: str, package: str | None = None) -> ModuleType:
        return importlib.import_module(module, package=package)

    def import_from_cwd(self, module: str, imp: Any = None, package: str | None = None) -> Any:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        return (imp or self.import_module)(module, package=package)

    def import_task_module(self, module: str) -> ModuleType:
        self.task_modules.add(module)
        return self.import_module(module)

    @property
    def default_modules(self) -> tuple[str, ...]:
        conf = self.app.conf
        return (
            *self.builtin_modules,
            *_as_list(conf.imports),
            *_as_list(conf.include),
        )

    def import_default_modules(self) -> list[ModuleType]:
        """Import the ``imports`` and ``include`` modules (the app's task modules)."""
        return [self.import_task_module(module) for module in self.default_modules]

    def autodiscover_tasks(
        self, packages: Iterable[str] | None, related_name: str = "tasks"
    ) -> None:
        self.app.autodiscover_tasks(packages, related_name, force=True)

    def find_module(self, module: str) -> Any:
        from importlib.util import find_spec

        return find_spec(module)

    # -- the worker ---------------------------------------------------------------------
    def init_worker(self) -> None:
        if not self.worker_initialized:
            self.worker_initialized = True
            self.import_default_modules()
            self.on_worker_init()

    def shutdown_worker(self) -> None:
        self.on_worker_shutdown()

    def init_worker_process(self) -> None:
        self.on_worker_process_init()

    # -- configuration ------------------------------------------------------------------
    def config_from_object(self, obj: Any, silent: bool = False) -> bool:
        try:
            source = load_object(obj)
        except (ImportError, AttributeError):
            if silent:
                return False
            raise
        self._conf = dict(source) if isinstance(source, dict) else _public(source)
        return True

    def read_configuration(self, env: str = "CELERY_CONFIG_MODULE") -> dict[str, Any] | None:
        name = os.environ.get(env)
        return _public(self.import_from_cwd(name)) if name else None

    @property
    def conf(self) -> Any:
        if self._conf is _UNREAD:
            self._conf = self.read_configuration()
        return self._conf

    def cmdline_config_parser(
        self, args: Iterable[str], namespace: str = "celery"
    ) -> dict[str, Any]:
        """Celery's ``key=value`` command-line settings: ``celery.broker_url=...`` or
        ``.broker_url=...`` (the default namespace) is ``broker_url``; a value written
        ``(json)[1, 2]`` (or ``(int)``, ``(float)``, ``(bool)``, ``(list)``, ``(dict)``)
        is converted."""
        out: dict[str, Any] = {}
        prefix = (namespace or "").lower()
        for arg in args:
            key, sep, value = arg.partition("=")
            if not sep:
                raise ValueError(f"{arg!r}: a command-line setting is written key=value")
            key = key.lower().replace(".", "_")
            if key.startswith("_"):
                key = key[1:]
            elif prefix and key.startswith(prefix + "_"):
                key = key[len(prefix) + 1 :]
            out[key] = _cast(value)
        return out


def _cast(value: str) -> Any:
    for kind, convert in CASTS.items():
        marker = f"({kind})"
        if value.startswith(marker):
            return convert(value[len(marker) :])
    return value


CASTS: dict[str, Any] = {
    "json": json.loads, "list": json.loads, "tuple": json.loads, "dict": json.loads,
    "int": int, "float": float, "bool": lambda v: v.strip().lower() in ("1", "true", "yes", "on"),
}  # fmt: skip


def _as_list(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _public(source: Any) -> dict[str, Any]:
    return {k: getattr(source, k) for k in dir(source) if not k.startswith("_")}


__all__ = ["BaseLoader"]
