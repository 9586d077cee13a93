"""``celery.contrib.testing.mocks``: ``ContextMock``, a ``Mock`` usable in ``with``.

Celery's ``TaskMessage``, ``TaskMessage1`` and ``task_message_from_sig`` build mocked
AMQP messages for Celery's worker ``Request``; pyrula has neither the message protocol
nor that class, so they are not here (the census lists why).
"""

from __future__ import annotations

from typing import Any
from unittest.mock import Mock


class _ContextMock(Mock):
    # ``with`` looks __enter__/__exit__ up on the class, not the instance
    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None


def ContextMock(*args: Any, **kwargs: Any) -> Any:
    """A ``Mock`` whose ``with`` block yields the mock itself and lets exceptions
    through; its ``__enter__`` and ``__exit__`` record their calls."""
    obj: Any = _ContextMock(*args, **kwargs)
    obj.attach_mock(_ContextMock(), "__enter__")
    obj.attach_mock(_ContextMock(), "__exit__")
    obj.__enter__.return_value = obj
    obj.__exit__.return_value = None  # a true value would swallow the exception
    return obj


__all__ = ["ContextMock"]
