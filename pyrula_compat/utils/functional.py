"""``celery.utils.functional``: the functional helpers Celery (and kombu) export.

Each behaves as Celery 5.7's (``LRUCache``, ``lazy``, ``memoize``, ``is_list``,
``maybe_list`` and ``dictfilter`` are kombu's there). ``head_from_fun(fun)`` returns a
function with ``fun``'s signature that returns 1, for checking a call's arguments
without running it; it is built from ``inspect.signature``, not from generated source.
"""

from __future__ import annotations

import inspect
import operator
import threading
from collections import OrderedDict, UserDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from functools import partial, wraps
from itertools import islice
from typing import Any, TypeVar

from pyrula_compat.local import PromiseProxy

__all__ = [
    "LRUCache",
    "chunks",
    "dictfilter",
    "first",
    "firstmethod",
    "fun_accepts_kwargs",
    "head_from_fun",
    "is_list",
    "lazy",
    "mattrgetter",
    "maybe",
    "maybe_evaluate",
    "maybe_list",
    "memoize",
    "mlazy",
    "noop",
    "padlist",
    "regen",
    "uniq",
]

T = TypeVar("T")


class LRUCache(UserDict[Any, Any]):
    """A mapping that keeps at most ``limit`` keys, dropping the least recently used."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.mutex = threading.RLock()
        self.data: OrderedDict[Any, Any] = OrderedDict()

    def __getitem__(self, key: Any) -> Any:
        with self.mutex:
            self.data.move_to_end(key)
            return self.data[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        with self.mutex:
            self.data[key] = value
            self.data.move_to_end(key)
            if self.limit and len(self.data) > self.limit:
                self.data.popitem(last=False)

    def update(self, *args: Any, **kwargs: Any) -> None:
        with self.mutex:
            for key, value in dict(*args, **kwargs).items():
                self[key] = value

    def popitem(self, last: bool = True) -> tuple[Any, Any]:
        with self.mutex:
            return self.data.popitem(last)

    def incr(self, key: Any, delta: int = 1) -> int:
        """Add ``delta`` to the integer at ``key`` and return it."""
        with self.mutex:
            value = int(self.data.pop(key)) + delta
            self[key] = value
            return value


_KEYWORDS = object()


def memoize(
    maxsize: int | None = None,
    keyfun: Callable[[tuple[Any, ...], dict[str, Any]], Hashable] | None = None,
    Cache: type[LRUCache] = LRUCache,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Cache a function's results (at most ``maxsize``); the wrapper has ``hits``,
    ``misses`` and ``clear()``."""

    def decorate(fun: Callable[..., T]) -> Callable[..., T]:
        cache = Cache(limit=maxsize)

        @wraps(fun)
        def cached(*args: Any, **kwargs: Any) -> T:
            key = keyfun(args, kwargs) if keyfun else (*args, _KEYWORDS, *sorted(kwargs.items()))
            try:
                value: T = cache[key]
            except KeyError:
                value = fun(*args, **kwargs)
                cached.misses += 1  # type: ignore[attr-defined]
                cache[key] = value
            else:
                cached.hits += 1  # type: ignore[attr-defined]
            return value

        def clear() -> None:
            cache.clear()
            cached.hits = cached.misses = 0  # type: ignore[attr-defined]

        cached.hits = cached.misses = 0  # type: ignore[attr-defined]
        cached.clear = clear  # type: ignore[attr-defined]
        cached.original_func = fun  # type: ignore[attr-defined]
        return cached

    return decorate


class lazy:
    """``fun(*args, **kwargs)``, evaluated on every call (and by ``str``/``repr``)."""

    def __init__(self, fun: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._fun = fun
        self._args = args
        self._kwargs = kwargs

    def __call__(self) -> Any:
        return self.evaluate()

    def evaluate(self) -> Any:
        return self._fun(*self._args, **self._kwargs)

    def __str__(self) -> str:
        return str(self())

    def __repr__(self) -> str:
        return repr(self())

    def __eq__(self, other: object) -> bool:
        return bool(self() == other)

    def __ne__(self, other: object) -> bool:
        return bool(self() != other)

    __hash__ = None  # type: ignore[assignment]


class mlazy(lazy):
    """A ``lazy`` evaluated once; later calls return the same value."""

    evaluated = False
    _value: Any = None

    def evaluate(self) -> Any:
        if not self.evaluated:
            self._value = super().evaluate()
            self.evaluated = True
        return self._value


def maybe_evaluate(value: Any) -> Any:
    """A ``lazy``'s or a ``PromiseProxy``'s value; anything else as it is."""
    if isinstance(value, lazy):
        return value.evaluate()
    if isinstance(value, PromiseProxy):
        return value.__maybe_evaluate__()
    return value


def is_list(
    obj: Any,
    scalars: tuple[type, ...] | None = (Mapping, str),
    iters: tuple[type, ...] = (Iterable,),
) -> bool:
    """Whether ``obj`` is iterable and not a mapping or a string."""
    return isinstance(obj, iters) and not isinstance(obj, scalars or ())


def maybe_list(obj: Any, scalars: tuple[type, ...] | None = (Mapping, str)) -> Any:
    """``obj`` if it is ``None`` or a list-like, else ``[obj]``."""
    return obj if obj is None or is_list(obj, scalars) else [obj]


def dictfilter(d: Mapping[Any, Any] | None = None, **kw: Any) -> dict[Any, Any]:
    """``d`` (updated with ``kw``) without the keys whose value is ``None``."""
    merged = kw if d is None else ({**d, **kw} if kw else d)
    return {k: v for k, v in merged.items() if v is not None}


def noop(*args: Any, **kwargs: Any) -> None:
    """Take any arguments; do nothing."""


def first(predicate: Callable[[Any], Any] | None, it: Iterable[Any]) -> Any:
    """The first item of ``it`` that ``predicate`` accepts (with ``None``, the first
    item that is not ``None``); ``None`` if there is none."""
    for value in it:
        value = maybe_evaluate(value)
        if predicate(value) if predicate is not None else value is not None:
            return value
    return None


def firstmethod(method: str, on_call: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A function that, given objects, returns the first non-``None`` result of calling
    their ``method`` (objects without it are skipped; lazy objects are evaluated)."""

    def matcher(it: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
        for obj in it:
            meth = getattr(maybe_evaluate(obj), method, None)
            if meth is None:
                continue
            reply = on_call(meth, *args, **kwargs) if on_call else meth(*args, **kwargs)
            if reply is not None:
                return reply
        return None

    return matcher


def chunks(it: Iterator[T], n: int) -> Iterator[list[T]]:
    """Lists of ``n`` items from the iterator ``it`` (the last may be shorter).
    ``it`` must be an iterator: a sequence would repeat its items."""
    for item in it:
        yield [item, *islice(it, n - 1)]


def padlist(container: Iterable[Any], size: int, default: Any = None) -> list[Any]:
    """``container`` as a list of exactly ``size`` items, cut or padded with ``default``."""
    items = list(container)
    return items[:size] + [default] * (size - len(items))


def mattrgetter(*attrs: str) -> Callable[[Any], dict[str, Any]]:
    """A function returning ``{attr: getattr(obj, attr, None)}`` for ``attrs``."""
    return lambda obj: {attr: getattr(obj, attr, None) for attr in attrs}


def uniq(it: Iterable[T]) -> Iterator[T]:
    """The items of ``it`` without repeats, in order."""
    seen: set[Any] = set()
    for obj in it:
        if obj not in seen:
            seen.add(obj)
            yield obj


class _regen(list[Any]):
    """An iterable that can be iterated again: items are kept as they are consumed."""

    def __init__(self, it: Iterable[Any]) -> None:
        super().__init__()
        self.__it = iter(it)
        self.__done = False

    def __pull(self) -> bool:
        if self.__done:
            return False
        try:
            list.append(self, next(self.__it))
        except StopIteration:
            self.__done = True
            return False
        return True

    def __iter__(self) -> Iterator[Any]:
        index = 0
        while index < list.__len__(self) or self.__pull():
            yield list.__getitem__(self, index)
            index += 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice) or operator.index(index) < 0:
            return list.__getitem__(self.data, index)
        while list.__len__(self) <= index and self.__pull():
            pass
        return list.__getitem__(self, index)

    def __len__(self) -> int:
        return len(self.data)

    def __bool__(self) -> bool:
        return list.__len__(self) > 0 or self.__pull()

    def __eq__(self, other: object) -> bool:
        return self.data == other

    __hash__ = None

    def __reduce__(self) -> Any:
        return list, (self.data,)

    @property
    def data(self) -> list[Any]:
        """Every item, consuming the rest of the iterable."""
        while self.__pull():
            pass
        return list(list.__iter__(self))

    def __repr__(self) -> str:
        shown = ", ".join(repr(e) for e in list.__iter__(self))
        return f"<{type(self).__name__}: [{shown}{'' if self.__done else '...'}]>"


def regen(it: Iterable[T]) -> Any:
    """``it`` if it is a list or tuple, else a list-like that consumes ``it`` as it is
    read and can be iterated again."""
    if isinstance(it, list | tuple):
        return it
    return _regen(it)


def fun_accepts_kwargs(fun: Callable[..., Any]) -> bool:
    """Whether ``fun`` takes arbitrary keyword arguments (``**kwargs``)."""
    code = getattr(fun, "__code__", None)
    if code is not None:
        return bool(code.co_flags & inspect.CO_VARKEYWORDS)
    try:
        parameters = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind == p.VAR_KEYWORD for p in parameters)


def head_from_fun(fun: Callable[..., Any], bound: bool = False) -> Callable[..., int]:
    """A function with ``fun``'s parameters that returns 1: calling it checks
    arguments as ``fun`` would (``TypeError`` on a bad call). With ``bound``, its first
    parameter (``self``) is filled already."""
    target: Any = fun
    name = getattr(fun, "__name__", None)
    if not (inspect.isfunction(fun) or inspect.ismethod(fun)) and callable(fun):
        name, target = type(fun).__name__, type(fun).__call__
    signature = inspect.signature(getattr(target, "__func__", target), follow_wrapped=False)

    def head(*args: Any, **kwargs: Any) -> int:
        signature.bind(*args, **kwargs)
        return 1

    head.__name__ = head.__qualname__ = name or "head"
    head.__module__ = getattr(fun, "__module__", None) or __name__
    head.__signature__ = signature  # type: ignore[attr-defined]
    if bound:
        return partial(head, object())
    return head


def maybe(typ: Callable[[Any], T], val: Any) -> T | None:
    """``typ(val)``, or ``None`` if ``val`` is ``None``."""
    return typ(val) if val is not None else None
