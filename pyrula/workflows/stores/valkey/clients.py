"""The life of valkey-py clients outside their own loop: closing them from elsewhere,
and keeping a forked child off its parent's sockets. Plus URL masking for messages."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


INHERITED: list[tuple[asyncio.AbstractEventLoop, Any]] = []
"""Loops and clients a forked child inherited: kept alive, never collected, because
closing them would unregister the parent's sockets from the epoll instance both share."""


def disown(client: Any) -> None:
    """Mark an inherited client's transports closing, so nothing ever closes them through
    the parent's event loop: after a fork both processes share its epoll instance, and
    unregistering a socket there would deafen the parent's loop to it."""
    for connection in _connections(client):
        transport = getattr(getattr(connection, "_writer", None), "transport", None)
        if transport is not None:
            transport._closing = True


def _connections(client: Any) -> list[Any]:
    pools: list[Any] = []
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pools.extend(getattr(pool, "_available_connections", []))
        pools.extend(getattr(pool, "_in_use_connections", []))
    for node in getattr(client, "get_nodes", list)():
        pools.extend(getattr(node, "_connections", []))
    return pools


async def close_quietly(client: Any) -> None:
    with contextlib.suppress(Exception):
        await client.aclose()


def abandon(client: Any) -> None:
    """Close the sockets of a client whose loop is gone (no loop left to close them on)."""
    for connection in _connections(client):
        writer = getattr(connection, "_writer", None)
        transport = getattr(writer, "transport", None)
        sock = getattr(transport, "_sock", None)
        if sock is not None:
            with contextlib.suppress(Exception):
                sock.close()
            transport._sock = None  # type: ignore[union-attr]
