"""``celery.app.utils``' ``bugreport``: what to paste into a bug report.

The versions (the Celery API mirrored, pyrula, Python), the platform, the store URL
and the settings, with passwords in URLs masked and settings whose names suggest a
secret (``API``, ``TOKEN``, ``KEY``, ``SECRET``, ``PASS``, ``SIGNATURE``,
``DATABASE``) hidden, as Celery's ``humanize(censored=True)`` hides them.
"""

from __future__ import annotations

import platform
import re
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from pyrula_compat.app.base import Celery

HIDDEN_SETTINGS = re.compile("API|TOKEN|KEY|SECRET|PASS|PROFANITIES_LIST|SIGNATURE|DATABASE", re.I)
MASK = "********"


def masked(value: Any) -> Any:
    """A URL with its password replaced by ``********``; anything else as it is."""
    if not isinstance(value, str) or "://" not in value:
        return value
    parts = urlsplit(value)
    if parts.password is None:
        return value
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}{port}"))


def censored(key: str, value: Any) -> Any:
    return MASK if HIDDEN_SETTINGS.search(key) else masked(value)


def bugreport(app: Celery) -> str:
    """The report, as text."""
    from pyrula_compat import VERSION_BANNER

    try:
        pyrula_version = version("pyrula")
    except PackageNotFoundError:
        pyrula_version = "unknown"
    settings = "\n".join(f"{key}: {censored(key, app.conf[key])!r}" for key in sorted(app.conf))
    arch = ", ".join(x for x in platform.architecture() if x)
    return (
        f"software -> celery API:{VERSION_BANNER} pyrula:{pyrula_version}"
        f" py:{platform.python_version()}\n"
        f"platform -> system:{platform.system()} arch:{arch}\n"
        f"            kernel version:{platform.release()}"
        f" imp:{platform.python_implementation()}\n"
        f"settings -> store:{masked(app.store_url()) or 'memory'}\n\n{settings}\n"
    )
