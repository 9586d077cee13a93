"""Connections to Valkey: one valkey-py client per event loop, fork-safe; calls into the
function library with "Function not found" recovery; driver errors translated.

valkey-py's asyncio connections belong to the loop that opened them, and a store is used
from several loops at once (the blocking client's loop thread, a worker's loop, a fresh
``asyncio.run`` of the blocking schedule API), so :class:`Server` keeps a client per
running loop, created on first use there and dropped once that loop is closed. A forked
child never touches its parent's sockets: clients are dropped when the pid changes.

A blocking wait whose caller gives up (an idle claimer woken for another reason) keeps
its connection: it is parked until its reply comes and the connection goes back to the
pool (:class:`.clients.Parking`; only waits whose reply may be dropped). Data-loss
detection (markers, checked every so many calls) is the :class:`.dataloss.DataLoss`
half of :class:`Server`. On a single node speaking RESP2, commands and FCALLs skip
valkey-py's command layers and its parser (:mod:`.aio`); a cluster keeps them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import valkey.asyncio as valkey_async
from valkey import exceptions as vex

from pyrula.workflows.errors import (
    ConfigurationError,
    InvalidRunState,
    LeaseLost,
    PyrulaError,
    RunNotFound,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
    StoreUnavailable,
)
from pyrula.workflows.stores.deadlines import deadline
from pyrula.workflows.stores.valkey import functions
from pyrula.workflows.stores.valkey.aio import execute, roundtrip, use_lean_parser
from pyrula.workflows.stores.valkey.clients import (
    INHERITED,
    Parking,
    abandon,
    close_on,
    close_quietly,
    disown,
    droppable,
    mask_url,
)
from pyrula.workflows.stores.valkey.cluster_client import ClusterClient
from pyrula.workflows.stores.valkey.dataloss import DataLoss
from pyrula.workflows.stores.valkey.keys import Keys
from pyrula.workflows.stores.valkey.resp import pack_command
from pyrula.workflows.stores.valkey.urls import check_url

log = logging.getLogger(__name__)

UNAVAILABLE = (
    vex.ConnectionError,
    vex.TimeoutError,
    vex.BusyLoadingError,
    vex.ClusterDownError,
    vex.TryAgainError,
    vex.ReadOnlyError,
    vex.OutOfMemoryError,  # "OOM": refused before anything ran (valkey-py cuts the prefix)
    vex.ClusterError,
    OSError,
)
VANISHED = (RunNotFound, LeaseLost)
"""Errors that also follow a data loss (a run we knew of is gone): the markers are
checked before one is raised, so a flushed server is reported by that very call."""
_PYRULA_ERROR = re.compile(r"PYRULA_(\w+) (.*?)(?: script: .*)?$", re.S)
Call = tuple[str, str, Sequence[Any]]
"""(function name, routing key, arguments after the clock override)"""


class Server(DataLoss):
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
        check_url(url, self.masked)
        self.keys = keys
        self.cluster = cluster
        self.socket_timeout = socket_timeout
        self._clock_arg = clock_arg
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, Any] = {}
        self._lean: set[int] = set()
        """ids of the clients whose FCALLs take the lean path (aio.py): single node, RESP2"""
        self._pid = os.getpid()
        self.lib = functions.library()
        self.parking = Parking()
        """Blocking commands whose caller gave up, reading their reply (cluster_client.py)."""
        DataLoss.__init__(self)

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
                self._lean = set()
                self._pid = os.getpid()
                self.parking.forget()
            client = self._clients.get(loop)
            if client is None:
                for stale in [other for other in self._clients if other.is_closed()]:
                    dropped = self._clients.pop(stale)
                    self._lean.discard(id(dropped))
                    abandon(dropped)
                client = self._make()
                self._clients[loop] = client
                if not self.cluster and use_lean_parser(client):
                    self._lean.add(id(client))
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
            # ClusterClient follows MOVED/ASK and waits out a reshard (cluster_client.py).
            options["connection_error_retry_attempts"] = 0
            return ClusterClient.from_url(self.url, **options)
        return valkey_async.Valkey.from_url(self.url, **options)

    async def close(self) -> None:
        """Close every loop's client: this loop's now, a running loop's on that loop, a
        closed loop's sockets directly."""
        loop = asyncio.get_running_loop()
        with self._lock:
            clients, self._clients = self._clients, {}
            self._lean = set()
        await self.parking.cancel_all()
        mine = clients.pop(loop, None)
        for other_loop, other in clients.items():
            if other_loop.is_closed() or not await close_on(other_loop, other):
                abandon(other)
        if mine is not None:
            await close_quietly(mine)

    # -- calls -------------------------------------------------------------------------
    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        text = str(exc) or (
            f"no reply within socket_timeout ({self.socket_timeout:g} s)"
            if isinstance(exc, TimeoutError)  # a deadline() cut (also a slot that kept moving)
            else type(exc).__name__
        )
        return StoreUnavailable(f"Valkey at {self.masked} is unavailable: {text}")

    def unreachable(self, exc: BaseException) -> PyrulaError:
        """The error for a server that did not answer open()'s first PING."""
        text = str(exc).rstrip(".")
        if isinstance(exc, vex.AuthenticationError):
            return ConfigurationError(
                f"Valkey at {self.masked} refused the credentials: {text}. Check the user "
                "name and password in the URL (redis://user:password@host:port)"
            )
        if "cluster mode is not enabled" in text.lower():
            return ConfigurationError(
                f"Valkey at {self.masked} is not a cluster: drop cluster=True (or "
                "cluster=true from the URL)"
            )
        return StoreUnavailable(
            f"cannot reach Valkey at {self.masked}: {text}. Is the server running, and is "
            "the URL right?"
        )

    def translate(self, exc: BaseException) -> BaseException:
        """The pyrula error for a driver error (domain errors come from the Lua)."""
        if isinstance(exc, UNAVAILABLE):
            self._unreachable = True
            return self.unavailable(exc)
        text = str(exc)
        if isinstance(exc, vex.MovedError) and not self.cluster:
            return ConfigurationError(
                f"Valkey at {self.masked} is a cluster node (it answered MOVED {text}): "
                "use cluster=True (or cluster=true in the URL)"
            )
        match = _PYRULA_ERROR.match(text)
        if match is None:
            # Refused before the call ran: a full server, one loading or without its
            # primary or replicas, or one refusing writes after a failed save (MISCONF).
            if text.startswith(("OOM", "LOADING", "MASTERDOWN", "NOREPLICAS", "MISCONF")):
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
        if self._check_due():
            await self.verify()
        if block > 0 and droppable(args):
            return await self._blocking(args, block)
        return await self._command(self.client(), args, block)

    async def _command(self, client: Any, args: Sequence[Any], block: float) -> Any:
        payload = self._packed(client, [args])
        try:
            async with deadline(self.socket_timeout + block):
                if payload is None:
                    reply = await client.execute_command(*args)
                else:
                    reply = await execute(client, payload, args[0])
        except Exception as exc:
            raise self.translate(exc) from None
        return reply

    async def commands(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Several plain commands (reads) in one round trip, one per node on a cluster
        (valkey-py's cluster pipeline routes each by its key); their replies in order, an
        error reply raised translated. A reply may come raw (a single node: HGETALL a
        flat list) or through valkey-py's response callback (a dict): read either."""
        if not commands:
            return []
        if self._check_due():
            await self.verify()
        client = self.client()
        payload = self._packed(client, commands)
        try:
            async with deadline(self.socket_timeout):
                if payload is None:
                    async with client.pipeline(transaction=False) as pipe:
                        for command in commands:
                            pipe.execute_command(*command)
                        replies = list(await pipe.execute())
                elif len(commands) == 1:
                    replies = [await roundtrip(client, payload, 1)]
                else:
                    replies = list(await roundtrip(client, payload, len(commands)))
        except Exception as exc:
            raise self.translate(exc) from None
        for reply in replies:
            if isinstance(reply, BaseException):
                raise self.translate(reply)
        return replies

    async def _blocking(self, args: Sequence[Any], block: float) -> Any:
        """A blocking command whose reply may be dropped (clients.droppable): it runs in
        a task of its own, and a caller cancelled meanwhile parks that task instead of
        cancelling it, so the connection goes back to the pool once the reply (or the
        command's own timeout) arrives instead of being closed and opened again."""
        client = self.client()
        inner = asyncio.ensure_future(self._command(client, args, block))
        try:
            return await asyncio.shield(inner)
        except asyncio.CancelledError:
            if inner.done():
                if not inner.cancelled():
                    inner.exception()  # retrieved: the caller is gone
            elif not (self._owns(client) and self.parking.park(inner)):
                inner.cancel()  # closing (or too many parked): drop the connection
            raise

    def _owns(self, client: Any) -> bool:
        """Whether ``client`` is still this loop's live client (not closed meanwhile)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            return self._clients.get(loop) is client and os.getpid() == self._pid

    def _packed(self, client: Any, commands: Sequence[Sequence[Any]]) -> bytes | None:
        """``commands`` packed for :func:`.aio.roundtrip`, or None if ``client`` does
        not take that path (a cluster, RESP3) or an argument is one only valkey-py's
        packer sends (a float)."""
        if id(client) not in self._lean:
            return None
        try:
            return b"".join(map(pack_command, commands))
        except TypeError:
            return None

    def _fcall_args(self, name: str, key: str, args: Sequence[Any]) -> tuple[Any, ...]:
        return ("FCALL", self.lib.function(name), 1, key, self._clock_arg(), *args)

    async def _send(self, client: Any, name: str, key: str, args: Sequence[Any]) -> Any:
        command = self._fcall_args(name, key, args)
        payload = self._packed(client, [command])
        if payload is not None:
            return await roundtrip(client, payload, 1)
        if self.cluster:
            # Route by our key ourselves: valkey-py would otherwise ask the server
            # (COMMAND GETKEYS) before every FCALL. A node that answers MOVED or ASK
            # is followed by ClusterClient (cluster_client.py), not by this pinning.
            await client.initialize()  # a no-op once this loop's client knows the slots
            return await client.execute_command(
                *command, target_nodes=client.get_node_from_key(key)
            )
        return await client.execute_command(*command)

    async def call(self, name: str, key: str, *args: Any) -> Any:
        """FCALL ``name`` routed by ``key``; a missing library is loaded again once."""
        if self._check_due():
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
            error = self.translate(exc)
        else:
            return reply
        if isinstance(error, VANISHED):
            await self.verify()  # a run we knew of is gone: was the data flushed?
        raise error from None

    async def call_many(self, calls: Sequence[Call]) -> list[Any]:
        """Several FCALLs in one round trip (one per node on a cluster); each result is
        the reply or the translated exception, in order."""
        if not calls:
            return []
        if self._check_due():
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
        if any(isinstance(result, VANISHED) for result in out):
            await self.verify()
        return out

    async def _send_many(self, client: Any, calls: Sequence[Call]) -> list[Any]:
        if self.cluster:
            return list(
                await asyncio.gather(
                    *(self._send(client, n, k, a) for n, k, a in calls), return_exceptions=True
                )
            )
        payload = self._packed(client, [self._fcall_args(n, k, a) for n, k, a in calls])
        if payload is not None:
            try:
                if len(calls) == 1:
                    try:
                        return [await roundtrip(client, payload, 1)]
                    except vex.ResponseError as exc:  # as the pipeline reports it
                        return [exc]
                return list(await roundtrip(client, payload, len(calls)))
            except Exception as exc:
                raise self.translate(exc) from None
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
