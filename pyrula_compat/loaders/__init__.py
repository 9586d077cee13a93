"""``celery.loaders``: find a loader class by name or alias."""

from __future__ import annotations

from typing import Any

from pyrula_compat.config import load_object

LOADER_ALIASES = {
    "app": "pyrula_compat.loaders.app:AppLoader",
    "default": "pyrula_compat.loaders.app:AppLoader",
    "celery.loaders.app:AppLoader": "pyrula_compat.loaders.app:AppLoader",
    "celery.loaders.default:Loader": "pyrula_compat.loaders.app:AppLoader",
}


def get_loader_cls(loader: Any) -> Any:
    """The loader class ``loader`` names (an alias, a ``"module:Class"`` path) or is."""
    if isinstance(loader, str):
        return load_object(LOADER_ALIASES.get(loader, loader))
    return loader


__all__ = ["get_loader_cls"]
