"""``celery.utils.imports``: finding modules and objects by name, as Celery does.

``symbol_by_name("pkg.mod:Name")`` (or ``"pkg.mod.Name"``) imports ``pkg.mod`` and
returns its attribute ``Name``; a name that is not a string is returned as it is.
``instantiate(name, *args, **kwargs)`` calls what it names. ``qualname(obj)`` is the
dotted name of a class or function (of an instance: of its class).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from importlib import import_module, reload
from types import ModuleType
from typing import Any, Protocol

__all__ = [
    "NotAPackage",
    "cwd_in_path",
    "find_module",
    "gen_task_name",
    "import_from_cwd",
    "instantiate",
    "module_file",
    "qualname",
    "reload_from_cwd",
    "symbol_by_name",
]

MP_MAIN_FILE = os.environ.get("MP_MAIN_FILE")


class _App(Protocol):
    main: str | None


class NotAPackage(Exception):
    """A dotted module name goes through a module that is not a package."""


def symbol_by_name(
    name: Any,
    aliases: Mapping[str, str] | None = None,
    imp: Callable[..., ModuleType] | None = None,
    package: str | None = None,
    sep: str = ".",
    default: Any = None,
    **kwargs: Any,
) -> Any:
    """The object ``name`` names: ``"module:attr"`` or ``"module.attr"`` (a bare
    ``"module"`` is the module). ``aliases`` maps short names to full ones; with a
    ``default``, a name that does not import or resolve returns it instead of raising
    ``ImportError`` or ``AttributeError``."""
    if not isinstance(name, str):
        return name  # a class or object already
    importer = imp or import_module
    name = (aliases or {}).get(name) or name
    sep = ":" if ":" in name else sep
    module_name, _, attr = name.rpartition(sep)
    if not module_name:
        attr, module_name = "", package or attr
    try:
        try:
            module = importer(module_name, package=package, **kwargs)
        except ValueError as exc:
            raise ValueError(f"Couldn't import {name!r}: {exc}") from exc
        return getattr(module, attr) if attr else module
    except (ImportError, AttributeError):
        if default is None:
            raise
    return default


def instantiate(name: Any, *args: Any, **kwargs: Any) -> Any:
    """``symbol_by_name(name)(*args, **kwargs)``."""
    return symbol_by_name(name)(*args, **kwargs)


def qualname(obj: Any) -> str:
    """``module.QualName`` of a class or function; of an instance, of its class."""
    if not hasattr(obj, "__name__") and hasattr(obj, "__class__"):
        obj = obj.__class__
    name: str = getattr(obj, "__qualname__", None) or obj.__name__
    if "." not in name:
        name = f"{obj.__module__}.{name}"
    return name


@contextmanager
def cwd_in_path() -> Iterator[str | None]:
    """Put the current directory first on ``sys.path`` while the block runs (if it
    is not there already)."""
    try:
        cwd: str | None = os.getcwd()
    except FileNotFoundError:
        cwd = None
    if not cwd or cwd in sys.path:
        yield None
        return
    sys.path.insert(0, cwd)
    try:
        yield cwd
    finally:
        if cwd in sys.path:
            sys.path.remove(cwd)


def find_module(
    module: str, path: Any = None, imp: Callable[[str], ModuleType] | None = None
) -> ModuleType:
    """Import ``module`` with the current directory on the path; when it fails, raise
    ``NotAPackage`` if a dotted parent is a plain module, else the ``ImportError``."""
    importer = imp or import_module
    with cwd_in_path():
        try:
            return importer(module)
        except ImportError:
            parts = module.split(".")
            for end in range(1, len(parts)):
                package = ".".join(parts[:end])
                try:
                    parent = importer(package)
                except ImportError:
                    break
                if not hasattr(parent, "__path__"):
                    raise NotAPackage(package) from None
            raise


def import_from_cwd(
    module: str, imp: Callable[..., ModuleType] | None = None, package: str | None = None
) -> ModuleType:
    """Import ``module``; modules in the current directory come first."""
    importer = imp or import_module
    with cwd_in_path():
        return importer(module, package=package)


def reload_from_cwd(
    module: ModuleType, reloader: Callable[[ModuleType], ModuleType] | None = None
) -> ModuleType:
    """Reload ``module`` with the current directory on the path."""
    with cwd_in_path():
        return (reloader or reload)(module)


def module_file(module: ModuleType) -> str:
    """The module's source file (``.py`` for a ``.pyc``)."""
    name = module.__file__ or ""
    return name[:-1] if name.endswith(".pyc") else name


def gen_task_name(app: _App, name: str, module_name: str | None) -> str:
    """The name Celery gives a task ``name`` defined in ``module_name``: the app's
    ``main`` stands for ``__main__``."""
    module_name = module_name or "__main__"
    module = sys.modules.get(module_name)
    if module is not None:
        module_name = module.__name__
        if MP_MAIN_FILE and getattr(module, "__file__", None) == MP_MAIN_FILE:
            module_name = "__main__"
    if module_name == "__main__" and app.main:
        return f"{app.main}.{name}"
    return ".".join(p for p in (module_name, name) if p)
