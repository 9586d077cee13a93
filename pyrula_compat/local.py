"""A proxy that looks up its object on every use (``current_app``, ``current_task``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Proxy:
    """Forwards attribute access, calls, truth and comparison to ``factory()``."""

    __slots__ = ("__factory",)

    def __init__(self, factory: Callable[[], Any]) -> None:
        object.__setattr__(self, "_Proxy__factory", factory)

    def _get_current_object(self) -> Any:
        return self.__factory()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get_current_object(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._get_current_object(), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._get_current_object(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._get_current_object()(*args, **kwargs)

    def __bool__(self) -> bool:
        return bool(self._get_current_object())

    def __eq__(self, other: object) -> bool:
        return bool(self._get_current_object() == other)

    def __ne__(self, other: object) -> bool:
        return bool(self._get_current_object() != other)

    def __hash__(self) -> int:
        return hash(self._get_current_object())

    def __repr__(self) -> str:
        return repr(self._get_current_object())

    def __str__(self) -> str:
        return str(self._get_current_object())

    def __dir__(self) -> list[str]:
        return dir(self._get_current_object())
