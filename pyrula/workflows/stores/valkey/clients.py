"""The life of valkey-py clients outside their own loop: closing them from elsewhere,
keeping a forked child off its parent's sockets, and blocking commands left to finish
on their own (:class:`Parking`). Plus URL masking for messages."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections.abc import Coroutine, Sequence
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


def drop_reply(task: asyncio.Future[Any]) -> None:
    """Done callback of a command nobody waits for any more (a kept or abandoned blocking
    wait): its reply, or its error, is retrieved and dropped."""
    if not task.cancelled():
        task.exception()


CLOSE_ON_OTHER_LOOP = 1.0
"""Seconds ``close_on`` waits for another loop to close its client."""


async def close_on(loop: asyncio.AbstractEventLoop, client: Any) -> bool:
    """Close ``client`` on ``loop``, the running loop of another thread; False when that
    loop did not get to it within ``CLOSE_ON_OTHER_LOOP`` (it stopped, or is blocked):
    the caller then closes the sockets itself (``abandon``)."""
    closed: concurrent.futures.Future[None] = concurrent.futures.Future()
    started: list[tuple[asyncio.Task[None], Coroutine[Any, Any, None]]] = []

    def finished(_: object) -> None:
        if not closed.done():
            closed.set_result(None)

    def start() -> None:
        closing = close_quietly(client)
        task = loop.create_task(closing)
        task.add_done_callback(finished)
        started.append((task, closing))

    try:
        loop.call_soon_threadsafe(start)
    except RuntimeError:  # that loop closed meanwhile
        return False
    try:
        await asyncio.wait_for(asyncio.wrap_future(closed), CLOSE_ON_OTHER_LOOP)
    except TimeoutError:  # one class from Python 3.11 on
        for task, closing in started:
            if inspect.getcoroutinestate(closing) == inspect.CORO_CREATED:
                # That loop stopped before the task's first step (it was stopping when
                # it ran start): nothing will run it, so neither it nor its coroutine
                # should be reported as abandoned; the caller closes the sockets.
                task._log_destroy_pending = False  # type: ignore[attr-defined]
                closing.close()
        return False
    return True


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
            transport._closing = True  # type: ignore[union-attr]
        if writer is not None:  # closed: valkey-py's Connection.__del__ would warn
            connection._writer = connection._reader = None


PARK_LIMIT = 16
"""At most this many abandoned blocking commands wait for their reply at once; past it,
one is cancelled the old way (valkey-py closes its connection)."""


def droppable(args: Sequence[Any]) -> bool:
    """Whether a blocking command's reply may be read and thrown away when its caller
    stopped waiting. Only two qualify, and only because what they consume is no data:

    * ``BLPOP`` on wake-up lists (``Keys.wake``, ``...}:wake``): an element is only a
      signal that work may be there, and claims clear the list anyway (``claim_due``
      deletes it); a dropped one at worst lets another idle claimer sleep out its
      slice.
    * ``BLMOVE`` from a list to itself (``wait_run`` on a run's completion list): it
      rotates the list in place, so nothing is taken from anyone.

    Any other blocking command (one that moves or pops real data) is not parked: when
    its caller is cancelled, valkey-py closes the connection and the server never
    delivers what it would have popped.
    """
    name = str(args[0]).upper()
    if name == "BLPOP":
        keys = args[1:-1]
        return bool(keys) and all(str(key).endswith("}:wake") for key in keys)
    if name == "BLMOVE":
        return len(args) == 6 and args[1] == args[2]
    return False


class Parking:
    """Blocking commands whose caller stopped waiting, left to run to their reply.

    A waiter blocked in ``BLPOP`` (an idle claimer) or ``BLMOVE`` (``wait_run``) is
    often cancelled before the server answers: woken for another reason, its own
    timeout run out, its worker stopping. Cancelling valkey-py in the middle of a read
    makes it close that connection (the reply would otherwise arrive on the next
    command), so each of these cost a reconnect. Instead the command runs in a task of
    its own; a cancelled caller parks that task here, it reads the reply (or reaches
    its own time limit, the blocking timeout plus ``socket_timeout``: a server that
    never answers costs one closed connection, never a leaked one), drops it, and
    valkey-py returns the connection to the pool. :func:`droppable` says which commands
    may be parked.
    """

    def __init__(self, limit: int = PARK_LIMIT) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def park(self, task: asyncio.Task[Any]) -> bool:
        """Keep ``task`` running to its end; False if the limit is reached."""
        with self._lock:
            if len(self._tasks) >= self.limit:
                return False
            self._tasks.add(task)
        task.add_done_callback(self._unpark)
        return True

    def _unpark(self, task: asyncio.Task[Any]) -> None:
        with self._lock:
            self._tasks.discard(task)
        drop_reply(task)

    def forget(self) -> None:
        """In a forked child: the parked tasks belong to the parent's loop."""
        with self._lock:
            self._tasks = set()

    async def cancel_all(self) -> None:
        """Cancel every parked command (closing its connection): this loop's are
        awaited, another running loop's are cancelled on that loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            tasks, self._tasks = self._tasks, set()
        mine: list[asyncio.Task[Any]] = []
        for task in tasks:
            owner = task.get_loop()
            if owner is loop:
                task.cancel()
                mine.append(task)
            elif not owner.is_closed():
                with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                    owner.call_soon_threadsafe(task.cancel)
        if mine:
            await asyncio.gather(*mine, return_exceptions=True)
