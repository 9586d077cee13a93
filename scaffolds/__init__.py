"""Templates for ``pyrula init`` (``plain/``) and ``pyrula init --celery`` (``celery/``).

Shipped in the wheel as package data and read with :mod:`importlib.resources`.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

KINDS = ("plain", "celery")


def template(kind: str) -> Any:
    """The folder of templates for ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"unknown scaffold {kind!r}; expected one of {', '.join(KINDS)}")
    return files(__name__) / kind
