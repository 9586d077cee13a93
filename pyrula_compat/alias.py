"""Opt-in: make ``import celery`` (and ``celery.*``) load ``pyrula_compat``.

For third-party code that imports ``celery`` itself. Only where Celery is not installed
(a real Celery always wins, and then this refuses), and only when asked: call
:func:`install` before anything imports ``celery``, pass ``--celery-alias`` to ``pyrula
worker``, or set ``PYRULA_CELERY_ALIAS=1`` and ``import pyrula_compat.alias`` early (a
``sitecustomize.py`` or the top of ``manage.py``). Code that reaches into Celery's
internals (``celery.app.trace``, kombu) still fails to import, which is what
integrations such as Sentry's treat as "Celery is not installed".
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

PREFIX = "celery"
TARGET = "pyrula_compat"


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # a throwaway module; exec_module puts the real one in its place

    def exec_module(self, module: ModuleType) -> None:
        # The import system returns whatever sys.modules holds after exec_module, so
        # the shim's own module object is used, untouched (its __name__ stays).
        sys.modules[module.__name__] = importlib.import_module(self.target)


class CeleryAliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``celery[.x]`` as ``pyrula_compat[.x]`` when that module exists."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        name = TARGET + fullname[len(PREFIX) :]
        try:
            found = importlib.util.find_spec(name)
        except ModuleNotFoundError:
            return None
        if found is None:
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(name), is_package=found.submodule_search_locations is not None
        )
        return spec


def celery_installed() -> bool:
    """Whether a real Celery can be imported (ignoring this alias)."""
    finders = [f for f in sys.meta_path if not isinstance(f, CeleryAliasFinder)]
    for finder in finders:
        find = getattr(finder, "find_spec", None)
        if find is not None and find(PREFIX, None) is not None:
            return True
    return False


def install() -> bool:
    """Install the alias; False (and nothing done) when a real Celery is importable."""
    if any(isinstance(f, CeleryAliasFinder) for f in sys.meta_path):
        return True
    existing = sys.modules.get(PREFIX)
    if existing is not None and not existing.__name__.startswith(TARGET):
        return False
    if celery_installed():
        return False
    sys.meta_path.insert(0, CeleryAliasFinder())  # before PathFinder: celery.x never
    # resolves through a shim package's __path__ (which would run its files twice)
    return True


def uninstall() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, CeleryAliasFinder)]
    for name in [n for n in sys.modules if n == PREFIX or n.startswith(PREFIX + ".")]:
        module = sys.modules[name]
        if getattr(module, "__name__", "").startswith(TARGET):
            del sys.modules[name]


if os.environ.get("PYRULA_CELERY_ALIAS", "").lower() in {"1", "true", "yes"}:
    install()

__all__ = ["CeleryAliasFinder", "celery_installed", "install", "uninstall"]
