"""A page's live region as server-sent events: rendered again every second and sent
when it changed, a keep-alive comment when nothing did for a while, and the event
``gone`` (then the end) when the page stops existing (a run deleted)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from pyrula.cli.dashboard.http import HttpError, Request, Response, head_bytes, sse_event
from pyrula.cli.dashboard.queries import QueryError
from pyrula.workflows.errors import PyrulaError

INTERVAL_S = 1.0
"""How often the region is rendered again (and sent when it changed)."""
KEEPALIVE_S = 15.0
RECONNECT_MS = 2000
"""What the browser waits before it reconnects a dropped stream."""

Region = Callable[[str, dict[str, list[str]]], Awaitable[str]]


async def stream(
    region: Region,
    prefix: str,
    request: Request,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    stopping: asyncio.Event,
) -> None:
    """Send ``region(path, query)`` of the page ``?path=`` names, now and whenever it
    changes, until the client leaves or ``stopping`` is set."""
    parts = urlsplit(request.one("path") or "/")
    path = parts.path
    if prefix and path.startswith(prefix):
        path = path[len(prefix) :] or "/"
    query = parse_qs(parts.query)
    head = head_bytes(Response(HTTPStatus.OK, "text/event-stream", b""), length=False)
    writer.write(head + f"retry: {RECONNECT_MS}\n\n".encode())
    await writer.drain()
    gone = asyncio.ensure_future(reader.read(1))  # the client closing the stream
    last: str | None = None
    quiet_since = time.monotonic()
    try:
        while not stopping.is_set() and not gone.done():
            event = None
            try:
                shown = await region(path, query)
            except HttpError as exc:
                shown, event = exc.message, "gone"
            except QueryError as exc:
                shown, event = str(exc), "gone"
            except PyrulaError as exc:  # the store is down: say so, keep trying
                shown, event = f"{type(exc).__name__}: {exc}", "trouble"
            if shown != last:
                writer.write(sse_event(shown, event))
                await writer.drain()
                last, quiet_since = shown, time.monotonic()
                if event == "gone":
                    return
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                writer.write(b": keepalive\n\n")
                await writer.drain()
                quiet_since = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(gone), INTERVAL_S)
    finally:
        gone.cancel()
