"""``celery.loaders.app``: the loader of every app."""

from __future__ import annotations

from pyrula_compat.loaders.base import BaseLoader


class AppLoader(BaseLoader):
    """The default loader (``app.loader``)."""


__all__ = ["AppLoader"]
