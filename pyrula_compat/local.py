"""``celery.local``: proxies that look their object up when used.

``Proxy(factory)`` calls ``factory()`` on every use (``current_app``, ``current_task``)
and forwards attribute access, calls, comparisons, arithmetic, containers and context
managers to what it returns; ``isinstance(proxy, cls)`` and ``proxy.__class__`` see
that object's class, as in Celery. ``PromiseProxy`` calls its factory once, at first
use, and keeps the object; ``__then__(fun, ...)`` defers a call until then (a signal
connected with a ``PromiseProxy`` sender waits for it so). ``maybe_evaluate(obj)``
evaluates a promise and returns anything else as it is; ``try_import(name)`` is the
module or ``default``.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from types import ModuleType
from typing import Any

__all__ = ["PromiseProxy", "Proxy", "maybe_evaluate", "try_import"]


def try_import(module: str, default: Any = None) -> ModuleType | Any:
    """The module named ``module``, or ``default`` if it does not import."""
    try:
        return import_module(module)
    except ImportError:
        return default


def _forward(op: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Proxy, *args: Any) -> Any:
        return op(self._get_current_object(), *args)

    return method


def _reflected(op: Callable[[Any, Any], Any]) -> Callable[[Proxy, Any], Any]:
    def method(self: Proxy, other: Any) -> Any:
        return op(other, self._get_current_object())

    return method


def _own(proxy: Proxy) -> dict[str, Any]:
    return object.__getattribute__(proxy, "__dict__")  # type: ignore[no-any-return]


class Proxy:
    """Forwards everything to ``local(*args, **kwargs)``, looked up on every use.

    ``local`` is a callable, or an object with ``__release_local__`` (a werkzeug-style
    local), whose attribute ``name`` is then the object. ``name`` and ``__doc__``
    answer ``__name__`` and ``__doc__`` without evaluating.
    """

    def __init__(
        self,
        local: Any,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        name: str | None = None,
        __doc__: str | None = None,
    ) -> None:
        object.__setattr__(self, "_Proxy__local", local)
        object.__setattr__(self, "_Proxy__args", tuple(args or ()))
        object.__setattr__(self, "_Proxy__kwargs", dict(kwargs or {}))
        if name is not None:
            object.__setattr__(self, "__custom_name__", name)
        if __doc__ is not None:
            object.__setattr__(self, "__doc__", __doc__)

    def _get_current_object(self) -> Any:
        """The object behind the proxy, looked up now."""
        local = object.__getattribute__(self, "_Proxy__local")
        if not hasattr(local, "__release_local__"):
            args = object.__getattribute__(self, "_Proxy__args")
            kwargs = object.__getattribute__(self, "_Proxy__kwargs")
            return local(*args, **kwargs)
        name = _own(self).get("__custom_name__")
        try:
            return getattr(local, name or "")
        except AttributeError:
            raise RuntimeError(f"no object bound to {name}") from None

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance sees the object's class
        return type(self._get_current_object())

    def __getattr__(self, name: str) -> Any:
        if name == "__name__" and "__custom_name__" in _own(self):
            return _own(self)["__custom_name__"]
        if name == "__members__":
            return dir(self._get_current_object())
        return getattr(self._get_current_object(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get_current_object(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._get_current_object(), name)

    def __dir__(self) -> list[str]:
        try:
            return dir(self._get_current_object())
        except RuntimeError:
            return []

    def __repr__(self) -> str:
        try:
            return repr(self._get_current_object())
        except RuntimeError:
            return f"<{type(self).__name__} unbound>"

    def __str__(self) -> str:
        return str(self._get_current_object())

    def __bool__(self) -> bool:
        try:
            return bool(self._get_current_object())
        except RuntimeError:
            return False

    def __hash__(self) -> int:
        return hash(self._get_current_object())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get_current_object()(*args, **kwargs)

    def __enter__(self) -> Any:
        return self._get_current_object().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._get_current_object().__exit__(*exc)

    def __reduce__(self) -> Any:
        return self._get_current_object().__reduce__()

    __eq__ = _forward(operator.eq)
    __ne__ = _forward(operator.ne)
    __lt__ = _forward(operator.lt)
    __le__ = _forward(operator.le)
    __gt__ = _forward(operator.gt)
    __ge__ = _forward(operator.ge)
    __len__ = _forward(len)
    __iter__ = _forward(iter)
    __contains__ = _forward(operator.contains)
    __getitem__ = _forward(operator.getitem)
    __setitem__ = _forward(operator.setitem)
    __delitem__ = _forward(operator.delitem)
    __add__ = _forward(operator.add)
    __sub__ = _forward(operator.sub)
    __mul__ = _forward(operator.mul)
    __matmul__ = _forward(operator.matmul)
    __truediv__ = _forward(operator.truediv)
    __floordiv__ = _forward(operator.floordiv)
    __mod__ = _forward(operator.mod)
    __divmod__ = _forward(divmod)
    __pow__ = _forward(pow)
    __lshift__ = _forward(operator.lshift)
    __rshift__ = _forward(operator.rshift)
    __and__ = _forward(operator.and_)
    __xor__ = _forward(operator.xor)
    __or__ = _forward(operator.or_)
    __radd__ = _reflected(operator.add)
    __rsub__ = _reflected(operator.sub)
    __rmul__ = _reflected(operator.mul)
    __rtruediv__ = _reflected(operator.truediv)
    __rfloordiv__ = _reflected(operator.floordiv)
    __rmod__ = _reflected(operator.mod)
    __neg__ = _forward(operator.neg)
    __pos__ = _forward(operator.pos)
    __abs__ = _forward(abs)
    __invert__ = _forward(operator.invert)
    __int__ = _forward(int)
    __float__ = _forward(float)
    __complex__ = _forward(complex)
    __index__ = _forward(operator.index)


_UNSET = object()


class PromiseProxy(Proxy):
    """A proxy that evaluates its object once, at first use, and keeps it."""

    def _get_current_object(self) -> Any:
        thing = _own(self).get("__thing", _UNSET)
        return self.__evaluate__() if thing is _UNSET else thing

    def __then__(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``fun(*args, **kwargs)`` now if evaluated, else right after it is."""
        if self.__evaluated__():
            return fun(*args, **kwargs)
        pending = _own(self).setdefault("__pending__", deque())
        pending.append((fun, args, kwargs))
        return None

    def __evaluated__(self) -> bool:
        """Whether the object was looked up already."""
        return "__thing" in _own(self)

    def __maybe_evaluate__(self) -> Any:
        return self._get_current_object()

    def __evaluate__(self) -> Any:
        """Look the object up, keep it, and run the calls ``__then__`` deferred."""
        thing = Proxy._get_current_object(self)
        own = _own(self)
        own["__thing"] = thing
        for attr in ("_Proxy__local", "_Proxy__args", "_Proxy__kwargs"):
            own.pop(attr, None)
        pending = own.pop("__pending__", None)
        while pending:
            fun, args, kwargs = pending.popleft()
            fun(*args, **kwargs)
        return thing


def maybe_evaluate(obj: Any) -> Any:
    """A promise's object (evaluating it), or ``obj`` itself."""
    if isinstance(obj, PromiseProxy):
        return obj.__maybe_evaluate__()
    return obj
