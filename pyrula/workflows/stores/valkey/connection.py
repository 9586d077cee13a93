"""Connections to Valkey: one valkey-py client per event loop, fork-safe; calls into the
function library with "Function not found" recovery; driver errors translated.

valkey-py's asyncio connections belong to the loop that opened them, and a store is used
from several loops at once (the blocking client's loop thread, a worker's loop, a fresh
``asyncio.run`` of the blocking schedule API), so :class:`Server` keeps a client per
running loop, created on first use there and dropped once that loop is closed. A forked
child never touches its parent's sockets: clients are dropped when the pid changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import valkey.asyncio as valkey_async

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline
else:  # valkey-py depends on async-timeout below 3.11.3
    from async_timeout import timeout as deadline  # type: ignore[import-not-found,unused-ignore]
from valkey import exceptions as vex
from valkey.asyncio.cluster import ValkeyCluster

from pyrula.workflows.errors import (
    InvalidRunState,
    LeaseLost,
    RunNotFound,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
    StoreUnavailable,
)
from pyrula.workflows.stores.valkey import functions
from pyrula.workflows.stores.valkey.clients import (
    INHERITED,
    abandon,
    close_quietly,
    disown,
    mask_url,
)
from pyrula.workflows.stores.valkey.keys import Keys

log = logging.getLogger(__name__)

UNAVAILABLE = (
    vex.ConnectionError,
    vex.TimeoutError,
    vex.BusyLoadingError,
    vex.ClusterDownError,
    vex.TryAgainError,
    vex.ReadOnlyError,
    vex.ClusterError,
    OSError,
)
_PYRULA_ERROR = re.compile(r"PYRULA_(\w+) (.*?)(?: script: .*)?$", re.S)
Call = tuple[str, str, Sequence[Any]]
"""(function name, routing key, arguments after the clock override)"""


class Server:
    """The Valkey server or cluster behind one store."""

    def __init__(
        self,
        url: str,
        keys: Keys,
        *,
        cluster: bool,
        clock_arg: Callable[[], str],
        socket_timeout: float,
    ) -> None:
        self.url = url
        self.masked = mask_url(url)
        self.keys = keys
        self.cluster = cluster
        self.socket_timeout = socket_timeout
        self._clock_arg = clock_arg
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._pid = os.getpid()
        self.lib = functions.library()
        self.run_ids: dict[str, str] = {}
        """Each node's ``run_id`` as of open(): a restart changes it."""
        self.markers: set[str] = set()
        """Data-loss markers this process wrote; one gone means the data went with it."""
        self.generation = 0
        """Goes up each time a data loss is detected (caches keyed on it start over)."""
        self.data_loss: list[str] = []
        """The message of every data loss detected, oldest first."""
        self._reported: set[str] = set()
        """Node run_ids whose data loss was reported (once each)."""
        self._suspect = False
        """Set when the server could not be reached: it may have restarted, so the next
        call first checks the markers are still there."""

    # -- clients -----------------------------------------------------------------------
    def client(self) -> Any:
        """The client of the running loop, created on first use."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if os.getpid() != self._pid:  # forked: the parent's sockets are not ours
                for inherited in self._clients.items():
                    disown(inherited[1])
                    INHERITED.append(inherited)
                self._clients = {}
                self._pid = os.getpid()
            client = self._clients.get(loop)
            if client is None:
                for stale in [other for other in self._clients if other.is_closed()]:
                    abandon(self._clients.pop(stale))
                client = self._make()
                self._clients[loop] = client
            return client

    def _make(self) -> Any:
        # Calls are bounded by deadline() here, not by valkey-py's socket_timeout: it
        # sends under asyncio.wait_for, which before Python 3.12 can swallow a
        # cancellation landing as the send completes (a cancelled worker loop ran on).
        options: dict[str, Any] = {
            "socket_timeout": None,
            "socket_connect_timeout": min(5.0, self.socket_timeout),
        }
        if self.cluster:
            # No silent resends: a call whose reply was lost must not run twice.
            options["connection_error_retry_attempts"] = 0
            return ValkeyCluster.from_url(self.url, **options)
        return valkey_async.Valkey.from_url(self.url, **options)

    async def close(self) -> None:
        """Close every loop's client: this loop's now, a running loop's on that loop, a
        closed loop's sockets directly."""
        loop = asyncio.get_running_loop()
        with self._lock:
            clients, self._clients = self._clients, {}
        mine = clients.pop(loop, None)
        for other_loop, other in clients.items():
            if other_loop.is_closed():
                abandon(other)
            else:
                with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                    asyncio.run_coroutine_threadsafe(close_quietly(other), other_loop)
        if mine is not None:
            await close_quietly(mine)

    # -- calls -------------------------------------------------------------------------
    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"Valkey at {self.masked} is unavailable: {exc}")

    def translate(self, exc: BaseException) -> BaseException:
        """The pyrula error for a driver error (domain errors come from the Lua)."""
        if isinstance(exc, UNAVAILABLE):
            self._suspect = True
            return self.unavailable(exc)
        text = str(exc)
        match = _PYRULA_ERROR.match(text)
        if match is None:
            if text.startswith(("OOM", "LOADING", "MASTERDOWN", "NOREPLICAS")):
                return self.unavailable(exc)
            return StoreError(f"Valkey at {self.masked} refused a call: {text}")
        code, detail = match.groups()
        if code == "NOTFOUND":
            return RunNotFound(f"no run with id {detail!r} in {self.masked}")
        if code == "LEASE":
            return LeaseLost(detail)
        if code == "STATE":
            return InvalidRunState(detail)
        if code == "SCHEDEXISTS":
            return ScheduleExists(
                f"schedule {detail!r} exists already; delete it first or create it with "
                "replace=True"
            )
        if code == "SCHEDNOTFOUND":
            return ScheduleNotFound(f"no schedule with id {detail!r} in {self.masked}")
        return StoreError(f"Valkey at {self.masked}: {text}")

    async def command(self, *args: Any, block: float = 0.0) -> Any:
        """A plain command (routed by its key on a cluster), errors translated; ``block``
        is how long a blocking command may wait, beyond the usual time limit."""
        if self._suspect:
            await self.verify()
        try:
            async with deadline(self.socket_timeout + block):
                reply = await self.client().execute_command(*args)
        except Exception as exc:
            raise self.translate(exc) from None
        return reply

    def _fcall_args(self, name: str, key: str, args: Sequence[Any]) -> tuple[Any, ...]:
        return ("FCALL", self.lib.function(name), 1, key, self._clock_arg(), *args)

    async def _send(self, client: Any, name: str, key: str, args: Sequence[Any]) -> Any:
        command = self._fcall_args(name, key, args)
        if self.cluster:
            # Route by our key ourselves: valkey-py would otherwise ask the server
            # (COMMAND GETKEYS) before every FCALL.
            await client.initialize()  # a no-op once this loop's client knows the slots
            return await client.execute_command(
                *command, target_nodes=client.get_node_from_key(key)
            )
        return await client.execute_command(*command)

    async def call(self, name: str, key: str, *args: Any) -> Any:
        """FCALL ``name`` routed by ``key``; a missing library is loaded again once."""
        if self._suspect:
            await self.verify()
        client = self.client()
        try:
            try:
                async with deadline(self.socket_timeout):
                    reply = await self._send(client, name, key, args)
            except vex.ResponseError as exc:
                if not functions.is_function_missing(exc):
                    raise
                await self.recover_library(client, key)
                async with deadline(self.socket_timeout):
                    reply = await self._send(client, name, key, args)
        except (StoreError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise self.translate(exc) from None
        return reply

    async def call_many(self, calls: Sequence[Call]) -> list[Any]:
        """Several FCALLs in one round trip (one per node on a cluster); each result is
        the reply or the translated exception, in order."""
        if not calls:
            return []
        if self._suspect:
            await self.verify()
        client = self.client()
        try:
            async with deadline(self.socket_timeout):
                results = await self._send_many(client, calls)
        except TimeoutError as exc:
            raise self.translate(exc) from None
        missing = [
            i
            for i, r in enumerate(results)
            if isinstance(r, vex.ResponseError) and functions.is_function_missing(r)
        ]
        if missing:
            await self.recover_library(client, calls[missing[0]][1])
            again = await self._send_many(client, [calls[i] for i in missing])
            for i, result in zip(missing, again, strict=False):
                results[i] = result
        out: list[Any] = []
        for result in results:
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                out.append(result if isinstance(result, StoreError) else self.translate(result))
            else:
                out.append(result)
        return out

    async def _send_many(self, client: Any, calls: Sequence[Call]) -> list[Any]:
        if self.cluster:
            return list(
                await asyncio.gather(
                    *(self._send(client, n, k, a) for n, k, a in calls), return_exceptions=True
                )
            )
        if len(calls) == 1:  # one call: no pipeline object (it costs more than the call)
            name, key, args = calls[0]
            try:
                return [await client.execute_command(*self._fcall_args(name, key, args))]
            except vex.ResponseError as exc:  # as the pipeline reports it
                return [exc]
            except Exception as exc:
                if isinstance(exc, StoreError):
                    raise
                raise self.translate(exc) from None
        try:
            async with client.pipeline(transaction=False) as pipe:
                for name, key, args in calls:
                    pipe.execute_command(*self._fcall_args(name, key, args))
                return list(await pipe.execute(raise_on_error=False))
        except Exception as exc:
            if isinstance(exc, StoreError):
                raise
            raise self.translate(exc) from None

    # -- library and data loss ---------------------------------------------------------
    async def recover_library(self, client: Any, key: str) -> None:
        """A node answered "Function not found": load the library again, unless it was
        pruned on purpose; if the node also lost the data, say so loudly."""
        try:
            await functions.check_not_pruned(client, self.masked, self.lib)
            marker = self.keys.tag_marker(key)
            if marker not in self.markers:
                marker = self.keys.meta_marker
            lost = marker in self.markers and not await client.exists(marker)
            await functions.load_library(client, self.cluster, self.lib)
            if lost:
                await self.report_data_loss(client, key, marker)
        except StoreError:
            raise
        except Exception as exc:
            raise self.translate(exc) from None
        log.warning(
            "Valkey at %s had lost the pyrula function library (restarted, or a new node); "
            "loaded %s again",
            self.masked,
            self.lib.name,
        )

    async def verify(self) -> None:
        """After the server was unreachable: are the markers still there? A server that
        restarted without persistence lost them (and the library, loaded again here)."""
        self._suspect = False
        client = self.client()
        try:
            if self.cluster:
                await client.initialize()  # the slot map may have been reset by the error
            by_node: dict[str, str] = {}
            for marker in sorted(self.markers):
                node = client.get_node_from_key(marker).name if self.cluster else "server"
                by_node.setdefault(node, marker)
            for marker in by_node.values():
                if not await client.exists(marker):
                    await functions.load_library(client, self.cluster, self.lib)
                    await self.report_data_loss(client, marker, marker)
        except StoreError:
            raise
        except Exception as exc:
            raise self.translate(exc) from None

    async def report_data_loss(self, client: Any, key: str, marker: str) -> None:
        node = client.get_node_from_key(key).name if self.cluster else "server"
        before = self.run_ids.get(node, "unknown")
        now = await self.node_run_id(client, node)
        self.run_ids[node] = now
        if now in self._reported:  # another call found the same loss first
            await self.write_markers(client, list(self.markers))
            return
        self._reported.add(now)
        message = (
            f"Valkey at {self.masked} LOST ITS DATA: the node's run_id changed from {before} "
            f"to {now} and the marker key {marker!r} written at first use is gone. It was "
            "restarted without persistence (or flushed): runs, journals and schedules it "
            "held are gone. Enable persistence (appendonly yes) on production servers."
        )
        log.error(message)
        self.data_loss.append(message)
        self.generation += 1
        await self.write_markers(client, list(self.markers))
        raise StoreUnavailable(message)

    async def write_markers(self, client: Any, markers: Sequence[str]) -> None:
        """Write data-loss markers (those already there are kept): one round trip per
        node, whatever their number."""
        async with client.pipeline(transaction=False) as pipe:
            for marker in markers:
                pipe.set(marker, "1", nx=True)
            await pipe.execute()
        self.markers.update(markers)

    async def node_run_id(self, client: Any, node: str) -> str:
        if not self.cluster:
            info = await client.info("server")
            return str(info.get("run_id", "unknown"))
        target = next((n for n in client.get_nodes() if n.name == node), None)
        if target is None:
            return "unknown"
        info = await client.execute_command("INFO", "server", target_nodes=target)
        if isinstance(info, dict) and "run_id" not in info and info:
            info = next(iter(info.values()))
        return str(info.get("run_id", "unknown")) if isinstance(info, dict) else "unknown"
