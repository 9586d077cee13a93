"""The blocking fast path of a ValkeyStore: the hot client calls in the calling thread.

The blocking :class:`pyrula.workflows.sync.WorkflowClient` runs the async client on a
private loop thread; every call then pays a thread hop (a future, a wake-up of the loop,
another of the caller) on top of the async driver. For the calls a Celery-style caller
makes per task (create a run without an idempotency key, read a run, wait for it to end)
:class:`BlockingValkey` talks to the server from the calling thread instead, on
valkey-py's blocking connections (:class:`Connections`: a pool shared by the threads of
the process), with :func:`.resp.pack_command` writing the commands and
:class:`.resp.LeanRESP2Parser` reading the replies.

It sends exactly what the async store sends, built by the store's own helpers (the key
names, the shard call, the ``FCALL`` arguments, ``new_run_args``, ``_ready_call``) and
reads the replies with the store's own reader (``to_run``), so it follows any change to
them.
It handles only the ordinary case: :meth:`BlockingValkey.ready` is false, or ``create``
returns False having stored nothing, when the async path must do the call: a
cluster, a store not yet opened in this process (or opened before a data loss), a server
that was unreachable (the async path checks it for data loss first), an idempotency
key, a workflow the store has not noted yet, a missing function library.

Thread-safe, and fork-safe: the pool is made again in a child (checked by pid on every
call), and the parent's sockets are left alone. Waiting blocks on the server
(``BLMOVE`` on the run's ``done`` list, as the store's ``wait_run`` does), never polls.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import valkey
from valkey import exceptions as vex

from pyrula.workflows.errors import RunNotFound, StoreError, StoreUnavailable
from pyrula.workflows.records import NewRun, RunRecord, RunStatus
from pyrula.workflows.stores.valkey import functions
from pyrula.workflows.stores.valkey.codec import new_run_args, text, to_run
from pyrula.workflows.stores.valkey.resp import LeanRESP2Parser, pack_command
from pyrula.workflows.stores.valkey.runs import RunOps, _hash, _secs


class Connections:
    """A process's blocking connections to one server, shared by its threads.

    valkey-py's ``ConnectionPool`` takes a lock twice and polls the socket on every
    command; here idle connections wait on a stack whose ``append``/``pop`` are atomic,
    a thread takes one (or opens a new one) per command and puts it back. A connection
    with anything to read while idle (the server closed it, or a reply was left
    unread) is reconnected before use. Made per process: ``pid`` says whose it is.
    """

    def __init__(self, url: str, **options: Any) -> None:
        template = valkey.ConnectionPool.from_url(  # type: ignore[no-untyped-call]
            url, parser_class=LeanRESP2Parser, **options
        )
        # The URL's options win over the arguments in from_url; the parser reads RESP2.
        kwargs = {**template.connection_kwargs, "parser_class": LeanRESP2Parser, "protocol": 2}
        self._make = functools.partial(template.connection_class, **kwargs)
        self._idle: deque[Any] = deque()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def take(self) -> Any:
        try:
            connection = self._idle.pop()
        except IndexError:
            connection = self._make()
            with self._lock:
                self._all.append(connection)
            return connection
        try:
            if connection._sock is not None and connection.can_read(0):
                connection.disconnect()  # closed by the server, or stale: start afresh
        except vex.ConnectionError:
            pass  # can_read disconnected it: the next send connects again
        return connection

    def give(self, connection: Any) -> None:
        self._idle.append(connection)

    def close(self) -> None:
        """Close every connection, also those in use (their callers get an error)."""
        with self._lock:
            connections = list(self._all)
        for connection in connections:
            connection.disconnect()


class BlockingValkey:
    """Blocking create / get / wait on one (single-node) ValkeyStore; see the module."""

    def __init__(self, store: RunOps) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._pool: Connections | None = None
        self.closed = False

    # -- when it applies ---------------------------------------------------------------
    def ready(self) -> bool:
        """Whether the store is open in this process and its server trusted: otherwise
        the async path goes first (it opens, verifies and recovers)."""
        store = self.store
        server = store._server
        return (
            not store.cluster
            and not server._suspect
            and store._opened == (os.getpid(), server.generation)
            and not self.closed
        )

    def knows(self, workflow: str) -> bool:
        """Whether the store has recorded ``workflow``'s shard count in this generation
        (the async ``_note_workflow`` does it on first use)."""
        return self.store._known_workflows.get(workflow) == self.store._server.generation

    # -- connections -------------------------------------------------------------------
    def _connections(self) -> Connections:
        pool = self._pool
        if pool is not None and pool.pid == os.getpid():
            return pool
        if self.closed:
            raise StoreUnavailable(f"the client of {self.store.url} is closed")
        with self._lock:
            if self._pool is None or self._pool.pid != os.getpid():
                # After a fork the parent's connections are dropped untouched: their
                # sockets are the parent's (valkey-py never shuts down another pid's).
                server = self.store._server
                self._pool = Connections(
                    server.url,
                    socket_timeout=server.socket_timeout + self.store.block_slice,
                    socket_connect_timeout=min(5.0, server.socket_timeout),
                )
            return self._pool

    def _send(self, *commands: Sequence[Any]) -> Any:
        """The reply to one command, or the replies to several sent at once (a pipeline:
        one write, one round trip); the first ResponseError is raised once all replies
        are read."""
        pool = self._connections()
        connection = pool.take()
        try:
            connection.send_packed_command([b"".join(map(pack_command, commands))], False)
            if len(commands) == 1:
                return connection.read_response()
            replies: list[Any] = []
            error: vex.ResponseError | None = None
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except vex.ResponseError as exc:
                    error = error or exc
                    replies.append(exc)
            if error is not None:
                raise error
            return replies
        except vex.ResponseError:
            raise
        except BaseException:
            connection.disconnect()  # a half-read reply must not reach the next caller
            raise
        finally:
            pool.give(connection)

    def _command(self, *commands: Sequence[Any]) -> Any:
        try:
            return self._send(*commands)
        except StoreError:
            raise
        except Exception as exc:
            raise self.store._server.translate(exc) from None

    def after_fork(self) -> None:
        """In a forked child: a lock another thread of the parent held is not ours."""
        self._lock = threading.Lock()

    def close(self) -> None:
        """Stop using the server: waits in other threads return (as the async store's do
        on close) and the sockets are closed."""
        self.closed = True
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and pool.pid == os.getpid():
            pool.close()

    # -- the calls ---------------------------------------------------------------------
    def create(self, new: NewRun) -> bool:
        """Create the queued run ``new`` (the caller checked :meth:`ready`): True, or
        False if the async path must do it, nothing having been created: an idempotency
        key, a workflow not noted yet, a missing function library."""
        store = self.store
        if new.idempotency_key is not None or not self.knows(new.workflow):
            return False
        shard = store._keys.shard_of(new.run_id)
        ready = store._ready_call(new)
        if ready is not None:
            reply = self._create_call(store._server._fcall_args(*ready))
            if reply is None:
                return False
            if text(reply[0]) == "created":
                return True
            store._note_owned_workflow(new.workflow)
        name, key, args = store._shard_call("create", shard, *new_run_args(new), "0")
        reply = self._create_call(store._server._fcall_args(name, key, args))
        if reply is None:
            return False
        payload, hints, timer_hint, followups = reply
        if hints or timer_hint or followups or text(payload[0]) != "created":
            # Never on a single node for a run without a parent; if it ever comes, it
            # is the store's to apply.
            raise StoreError(
                f"unexpected reply to create on {store.url}: {payload[0]!r} with "
                f"hints {hints!r} {timer_hint!r} and follow-ups {followups!r}"
            )
        return True

    def _create_call(self, command: tuple[Any, ...]) -> Any:
        """A create's reply; None when the async path must do it (a missing library)."""
        store = self.store
        try:
            return self._send(command)
        except vex.ResponseError as exc:
            if functions.is_function_missing(exc):
                return None  # the async path loads the library again
            raise store._server.translate(exc) from None
        except StoreError:
            raise
        except Exception as exc:
            raise store._server.translate(exc) from None

    def _fields(self, run_id: str) -> dict[str, str] | None:
        flat = self._command(("HGETALL", self.store._keys.run(run_id)))
        return fields(flat) if flat else None

    def get_run(self, run_id: str) -> RunRecord | None:
        found = self._fields(run_id)
        return None if found is None else to_run(run_id, found)

    def wait_run(self, run_id: str, timeout: float | None) -> RunRecord:
        """The store's ``wait_run``: the run once it ended, or as it is when ``timeout``
        passes (or the client closes). Raises RunNotFound.

        The same commands in the same order; a read that follows a block is sent with
        it (the server runs it once the block ends), which saves a round trip. A record
        is built only for the read that is returned."""
        store = self.store
        deadline = None if timeout is None else time.monotonic() + timeout
        key = store._keys.run(run_id)
        found = self._fields(run_id)
        while True:
            if found is None:
                raise RunNotFound(f"no run with id {run_id!r} in {store.url}")
            remaining = None if deadline is None else deadline - time.monotonic()
            if (
                RunStatus(found["st"]).is_terminal
                or self.closed
                or (remaining is not None and remaining <= 0)
            ):
                return to_run(run_id, found)
            block = store.block_slice if remaining is None else min(remaining, store.block_slice)
            done = store._keys.done(run_id)
            # Every waiter rotates the list in place, so one push wakes them all.
            try:
                _, flat = self._command(
                    ("BLMOVE", done, done, "RIGHT", "LEFT", _secs(block)), ("HGETALL", key)
                )
            except StoreError:
                if self.closed:
                    return to_run(run_id, found)
                raise
            found = fields(flat) if flat else None


def fields(flat: list[bytes]) -> dict[str, str]:
    """HGETALL's flat reply as the dict ``to_run`` reads (what the store's ``_hash``
    makes of it, decoded in one pass)."""
    try:
        decoded = map(bytes.decode, flat)
        return dict(zip(decoded, decoded, strict=False))  # pairs of one iterator
    except TypeError:  # not all bytes
        return _hash(flat)
