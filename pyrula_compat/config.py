"""``app.conf``: Celery's settings, by attribute or by key, with old names accepted.

Every setting Celery 5.7 documents reads its default (:mod:`pyrula_compat.app.defaults`).
Sources are read lazily, as Celery reads them: ``config_from_object(...)`` only records
the source, and the first read of any setting loads the configuration (then the app
sends ``on_after_configure``), so ``config_from_object("django.conf:settings",
namespace="CELERY")`` in ``proj/celery.py`` does not import Django settings before
Django is ready. A source that does not import raises its ``ImportError`` there, and one
that mixes Celery 3 names (``CELERY_ALWAYS_EAGER``) with new ones (``task_default_queue``)
raises :class:`ImproperlyConfigured` naming the renames, as Celery's ``detect_settings``
does. Setting a value (``conf.X = Y``, ``conf.update``) loads nothing.

A loaded source is kept, not copied: every lookup reads it, as Celery's ``Settings`` (a
``ChainMap`` over the changes, the source and the defaults) does. So a setting changed on
the source later (Django's ``override_settings``, ``monkeypatch.setattr(settings,
"CELERY_TASK_ALWAYS_EAGER", True)``, assigning a module attribute) takes effect at the
next call, and ``app.conf.task_always_eager = True`` (or ``conf.update``) wins over the
source. A setting is looked up under Celery's names: with ``namespace="CELERY"``
``CELERY_TASK_ALWAYS_EAGER`` first, then ``task_always_eager`` and the old name
``CELERY_ALWAYS_EAGER``; without one, the name and its old name. Django's lazy
settings object is read itself (not the settings it wraps), so ``override_settings``,
which swaps what it wraps, is seen too.
"""

from __future__ import annotations

import copy
import importlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

from pyrula_compat.app.defaults import OLD_KEYS, SETTINGS
from pyrula_compat.exceptions import ImproperlyConfigured

OLD_NAMES: dict[str, str] = {**OLD_KEYS, "CELERY_ENABLE_UTC": "enable_utc"}
"""Celery 3 setting names and their Celery 4+ names: Celery's, and ``CELERY_ENABLE_UTC``
(Celery 3's name, which Celery 4+ spells ``ENABLE_UTC``)."""
TO_OLD_NAME: dict[str, str] = {new: old for old, new in OLD_KEYS.items()}
OLD_NAMES_OF: dict[str, tuple[str, ...]] = {}
"""Each setting's old names (``enable_utc``: ``CELERY_ENABLE_UTC``, ``ENABLE_UTC``)."""
for _old, _new in OLD_NAMES.items():
    OLD_NAMES_OF[_new] = (*OLD_NAMES_OF.get(_new, ()), _old)
SETTING_KEYS = frozenset(SETTINGS)

ENV_OVERRIDES = {"broker_url": "CELERY_BROKER_URL", "result_backend": "CELERY_RESULT_BACKEND"}
"""Environment variables that override what the app passes, as in Celery."""

E_MIX_OLD_INTO_NEW = """

Cannot mix new and old setting keys, please rename the
following settings to the new format:

{renames}

"""
E_MIX_NEW_INTO_OLD = """

Cannot mix new setting names with old setting names, please
rename the following settings to use the old format:

{renames}

Or change all of the settings to use the new format :)

"""
"""Celery's messages (``celery.app.utils``) for a source that mixes the two styles."""


class ConfigurationNotFound(ModuleNotFoundError, ImproperlyConfigured):
    """``config_from_object(source, force=True)`` of a module or attribute that does not
    import: an ``ImportError`` (``ModuleNotFoundError``), as Celery raises, and an
    :class:`ImproperlyConfigured`, which pyrula's command line (``--config``) reports as a
    usage error. Read lazily (without ``force``), the source's own error is raised."""


def new_name(key: str, namespace: str | None = None) -> str | None:
    """The setting ``key`` of a source stands for, or None when it names none.

    With ``namespace`` (``"CELERY"``), a key starting ``CELERY_`` is the rest lower-cased
    (``CELERY_BROKER_URL`` -> ``broker_url``). Old upper-case names are mapped
    (``BROKER_URL`` -> ``broker_url``), with a namespace too, as Celery reads them;
    lower-case keys are taken as they are.
    """
    if namespace:
        prefix = namespace.rstrip("_") + "_"
        if key.startswith(prefix) and key[len(prefix) :].lower() in SETTINGS:
            return key[len(prefix) :].lower()
    if key in OLD_NAMES:
        return OLD_NAMES[key]
    if key.islower():
        return key
    return None


def check_not_mixed(keys: set[str]) -> None:
    """Raise :class:`ImproperlyConfigured` when ``keys`` (a source's, read without a
    namespace) use both Celery 3 names and new ones, as Celery does: the minority style
    is listed with its renames (the old names when there are as many of each). A setting
    given under both of its names is not listed."""
    new, old = keys & SETTING_KEYS, keys & OLD_NAMES.keys()
    if not (new and old):
        return
    if len(old) > len(new):
        left, convert, message = new, TO_OLD_NAME, E_MIX_NEW_INTO_OLD
    else:
        left, convert, message = old, OLD_NAMES, E_MIX_OLD_INTO_NEW
    renames = [f"{key:<36} -> {convert[key]}" for key in sorted(left) if convert[key] not in keys]
    if renames:
        raise ImproperlyConfigured(message.format(renames="\n".join(renames)))


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


Hook = Callable[[], None]
_MISSING = object()


class Source:
    """A configuration source as loaded: the object itself (a module, class, instance,
    mapping or Django's lazy settings), read on every lookup, and its namespace."""

    __slots__ = ("_candidates", "namespace", "obj", "prefix")

    def __init__(self, obj: Any, namespace: str | None) -> None:
        self.obj = obj
        self.namespace = namespace
        self.prefix = namespace.rstrip("_") + "_" if namespace else None
        self._candidates: dict[str, tuple[str, ...]] = {}

    def names(self) -> list[str]:
        """The names the source defines now (an object's public attributes)."""
        if isinstance(self.obj, Mapping):
            return [key for key in self.obj if isinstance(key, str)]
        return [key for key in dir(self.obj) if not key.startswith("_")]

    def candidates(self, key: str, name: str) -> tuple[str, ...]:
        """The names ``key`` (setting ``name``) is looked up under, in Celery's order
        (``ConfigurationView._to_keys``): with a namespace its prefixed name in the
        prefix's case first, then the key, the setting's name and its old names."""
        found = self._candidates.get(key)
        if found is None:
            keys = [key, name, *OLD_NAMES_OF.get(name, ())]
            prefix = self.prefix
            if prefix:
                prefixed = key if key.startswith(prefix) else prefix + key
                keys.insert(0, prefixed.upper() if prefix.isupper() else prefixed.lower())
            found = tuple(dict.fromkeys(keys))
            if len(self._candidates) < 4096:  # keys are setting names: a bounded set
                self._candidates[key] = found
        return found

    def lookup(self, key: str, name: str) -> Any:
        """The source's value for ``key``, or ``_MISSING``: read now, so a value changed
        on the object since (``override_settings``, ``monkeypatch.setattr``, assigning a
        module attribute) is the one returned."""
        obj = self.obj
        if isinstance(obj, Mapping):
            for candidate in self.candidates(key, name):
                if candidate in obj:
                    return obj[candidate]
            return _MISSING
        for candidate in self.candidates(key, name):
            value = getattr(obj, candidate, _MISSING)
            if value is not _MISSING:
                return value
        return _MISSING


class Settings(MutableMapping[str, Any]):
    """Celery's ``app.conf``: a mapping whose keys are also attributes.

    Values come from, highest first: what was set at run time, what the app was given,
    the configuration sources (read on every lookup, the latest source first),
    ``add_defaults``, then Celery's defaults.
    """

    def __init__(self, initial: Mapping[str, Any] | None = None) -> None:
        # Each app its own copies of the mutable defaults: add_periodic_task on one app
        # must not add the entry to every other app's beat_schedule.
        object.__setattr__(self, "_defaults", copy.deepcopy(SETTINGS))
        object.__setattr__(self, "_preconf", {})
        object.__setattr__(self, "_changes", {})
        object.__setattr__(self, "_sources", [])
        object.__setattr__(self, "_pending", [])
        object.__setattr__(self, "_configured", False)
        object.__setattr__(self, "_hooks", (None, None))
        object.__setattr__(self, "_lock", threading.RLock())  # receivers may read settings
        if initial:
            self.update(initial)

    # -- sources -----------------------------------------------------------------------
    def preconfigure(self, key: str, value: Any) -> None:
        """A value the app was built with (``Celery(broker=...)``): a configuration
        source does not override it, as in Celery."""
        self._preconf[OLD_NAMES.get(key, key)] = value

    def add_source(self, source: Any, namespace: str | None, silent: bool) -> None:
        """Read ``source`` on the next access (``config_from_object``)."""
        self._pending.append((source, namespace, silent))

    def add_defaults(self, values: Mapping[str, Any]) -> None:
        """Defaults above Celery's: any source or setting wins over them."""
        self._defaults.update({OLD_NAMES.get(k, k): v for k, v in values.items()})

    def on_load(self, before: Hook | None, after: Hook | None) -> None:
        """Call ``before`` as the configuration loads and ``after`` once it has (the app's
        ``on_configure`` and ``on_after_configure``)."""
        object.__setattr__(self, "_hooks", (before, after))

    @property
    def configured(self) -> bool:
        """Whether the configuration was loaded (by a read, or ``load()``)."""
        return bool(self._configured)

    def load(self, strict: bool = False) -> None:
        """Load the configuration now (``config_from_object(..., force=True)``): with
        ``strict``, a source that does not import raises :class:`ConfigurationNotFound`."""
        with self._lock:
            if not self._configured:
                self._configure(strict)
            else:
                self._load_pending(strict)

    def _configure(self, strict: bool) -> None:
        before, after = self._hooks
        object.__setattr__(self, "_configured", True)  # receivers may read settings
        try:
            if before is not None:
                before()
            self._load_pending(strict)
        except BaseException:
            object.__setattr__(self, "_configured", False)  # the next read tries again
            raise
        if after is not None:
            after()

    def _ensure(self) -> None:
        with self._lock:  # two threads reading first: one loads, the other waits
            if not self._configured:
                self._configure(False)
            elif self._pending:
                self._load_pending(False)

    def _load_pending(self, strict: bool) -> None:
        pending: list[tuple[Any, str | None, bool]] = self._pending
        while pending:
            source, namespace, silent = pending[0]
            try:
                obj = load_object(source)
            except (ImportError, AttributeError) as exc:
                if silent:
                    pending.pop(0)
                    continue
                if strict:
                    raise ConfigurationNotFound(
                        f"cannot load configuration {source!r}: {exc}",
                        name=getattr(exc, "name", None),
                    ) from exc
                if isinstance(exc, AttributeError):  # as Celery: not swallowed by getattr
                    raise ModuleNotFoundError(*exc.args) from exc
                raise
            loaded = Source(obj, namespace)
            if namespace is None:
                check_not_mixed(set(loaded.names()))
            pending.pop(0)
            self._sources.insert(0, loaded)  # the latest source is read first

    # -- mapping -----------------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if self._pending or not self._configured:  # read on every task call: cheap
            self._ensure()
        name = OLD_NAMES.get(key, key)
        if name in ENV_OVERRIDES:  # as in Celery, the environment wins over the app
            value = os.environ.get(ENV_OVERRIDES[name])
            if value:
                return value
        if name in self._changes:
            return self._changes[name]
        if name in self._preconf:
            return self._preconf[name]
        for source in self._sources:
            value = source.lookup(key, name)
            if value is not _MISSING:
                return value
        return self._defaults[name]

    def __setitem__(self, key: str, value: Any) -> None:
        self._changes[OLD_NAMES.get(key, key)] = value

    def __delitem__(self, key: str) -> None:
        """Forget what was set or given for ``key`` (the sources and defaults stay, as
        Celery deletes from its changes only)."""
        name = OLD_NAMES.get(key, key)
        changed = self._changes.pop(name, _MISSING) is not _MISSING
        if self._preconf.pop(name, _MISSING) is _MISSING and not changed:
            raise KeyError(key)

    def _keys(self) -> list[str]:
        found: list[str] = [*self._defaults, *self._preconf, *self._changes]
        for source in self._sources:
            names = (new_name(key, source.namespace) for key in source.names())
            found.extend(name for name in names if name)
        return list(dict.fromkeys(found))

    def __iter__(self) -> Iterator[str]:
        self._ensure()
        return iter(self._keys())

    def __len__(self) -> int:
        self._ensure()
        return len(self._keys())

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        try:
            self[key]
        except KeyError:
            return False
        return True

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

    def __repr__(self) -> str:  # reads nothing: a repr in a log must not load settings
        given = {*self._defaults, *self._preconf, *self._changes}
        return f"<Settings: {len(given)} keys, {len(self._sources)} sources>"

    def peek(self, key: str, default: Any = None) -> Any:
        """``key``'s value as it stands, without loading the configuration: what the app
        was given and what was set, else the default (for pyrula's own reads while tasks
        are registered, which must not load the configuration)."""
        name = OLD_NAMES.get(key, key)
        for given in (self._changes, self._preconf, self._defaults):
            if name in given:
                return given[name]
        return default

    def first(self, *keys: str) -> Any:
        """The first of ``keys`` whose value is not None."""
        return next((v for v in (self.get(k) for k in keys) if v is not None), None)

    @property
    def timezone(self) -> Any:
        """Celery's: ``timezone``, else Django's ``TIME_ZONE`` (read from the source)."""
        return self.first("timezone", "TIME_ZONE")

    @property
    def task_default_exchange(self) -> Any:
        """Celery's: ``task_default_exchange``, else the default queue's name."""
        return self.first("task_default_exchange", "task_default_queue")

    @property
    def task_default_routing_key(self) -> Any:
        """Celery's: ``task_default_routing_key``, else the default queue's name."""
        return self.first("task_default_routing_key", "task_default_queue")

    @property
    def changes(self) -> dict[str, Any]:
        """Settings changed at run time (``conf.X = Y`` or ``update``)."""
        return dict(self._changes)

    def humanize(self) -> str:
        return "\n".join(f"{key}: {self[key]!r}" for key in sorted(self))

    def find_option(self, name: str) -> Any:
        return self[name]
