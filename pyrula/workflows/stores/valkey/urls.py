"""Checking a Valkey URL before anything connects.

valkey-py passes every query-string option of a URL to its connection class as a keyword
argument, so a misspelt one (``?namespce=``) only fails on the first connect, as a
``TypeError`` that reads like an unreachable server. Here each option is checked against
what the connection takes, and the store's own options (which only ``open_store`` and
``ValkeyStore.from_url`` read from a URL) are named as such.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from urllib.parse import parse_qsl, urlsplit

from pyrula.workflows.errors import ConfigurationError

STORE_OPTIONS = (
    "namespace",
    "shard_count",
    "cluster",
    "shard_lease_ttl",
    "shard_lease_interval",
    "socket_timeout",
)
"""ValkeyStore arguments that may ride in a URL given to open_store / from_url."""

REFUSED = {"decode_responses": "the store decodes replies itself"}


@functools.cache
def connection_options(scheme: str) -> frozenset[str]:
    """Keyword arguments valkey-py's connection for ``scheme`` (and its pool) accept."""
    from valkey.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection

    cls: type = {"unix": UnixDomainSocketConnection, "rediss": SSLConnection}.get(
        scheme, SSLConnection if scheme == "valkeys" else Connection
    )
    names = {"max_connections"}  # the pool's own
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for param in inspect.signature(init).parameters.values():
            if param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD):
                names.add(param.name)
    return frozenset(names - {"self", "host", "port", "path", "username", "password"})


def check_url(url: str, masked: str) -> None:
    """Raise ConfigurationError for a URL valkey-py can't use, or a query option that no
    connection takes (the message says what to do instead)."""
    from valkey.asyncio.connection import parse_url

    try:
        parse_url(url)
    except ValueError as exc:  # a scheme, port or option value valkey-py can't use
        raise ConfigurationError(f"invalid Valkey URL {masked!r}: {exc}") from None
    scheme = urlsplit(url).scheme.lower()
    allowed = connection_options(scheme)
    for key, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if key in STORE_OPTIONS:
            raise ConfigurationError(
                f"{key!r} in the Valkey URL {masked!r} is a store option: pass {key}=... to "
                "ValkeyStore, or give the URL to open_store() or ValkeyStore.from_url(), "
                "which read it from the query string"
            )
        if key in REFUSED:
            raise ConfigurationError(
                f"{key!r} in the Valkey URL {masked!r} can't be set: {REFUSED[key]}"
            )
        if key not in allowed:
            close = difflib.get_close_matches(key, [*allowed, *STORE_OPTIONS], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigurationError(
                f"unknown option {key!r} in the Valkey URL {masked!r}: {hint}A URL takes "
                "valkey-py's connection options (db, client_name, ssl_cert_reqs, "
                "health_check_interval, ...) and, through open_store() or "
                f"ValkeyStore.from_url(), the store's ({', '.join(STORE_OPTIONS)})"
            )
