"""The lean asyncio path of a single-node ValkeyStore: its parser and its FCALLs.

valkey-py's asyncio client spends more CPU around a command than the server spends
running it: ``execute_command`` goes through a retry wrapper, a client-side-cache
lookup, a health check, its general packer, a response-callback lookup, and its RESP2
parser reads a reply one line (one ``StreamReader.readline``) per element.

* :class:`LeanAsyncRESP2Parser` is plugged into the client's connections as
  ``parser_class`` (RESP2 only, which is what the store's clients speak unless the URL
  asks for ``protocol=3``: then :func:`use_lean_parser` leaves valkey-py's own). It
  reads what the stream has into a :class:`.resp.Replies` buffer and parses replies
  with :func:`.resp.parse`, the blocking parser's code; every command of the client,
  pipelines and blocking waits included, reads through it.
* :func:`roundtrip` sends already packed commands (:func:`.resp.pack_command`) on a
  connection taken from the client's pool and reads their replies on it, without the
  layers above: what ``Server.call``/``call_many`` use for ``FCALL`` (which has no
  response callback, so the reply is the same value). A connection whose read or write
  is interrupted (cancelled, timed out, failed) is disconnected before it goes back to
  the pool, as valkey-py does: a half-read reply never reaches the next command.
  :func:`execute` is ``roundtrip`` plus valkey-py's response callback of the command
  (``HGETALL`` a dict, ``BLPOP`` a tuple ...): ``Server.command`` returns what
  ``execute_command`` would.
"""

from __future__ import annotations

import inspect
from typing import Any

from valkey import exceptions as vex
from valkey._parsers import Encoder
from valkey._parsers.base import AsyncBaseParser

from pyrula.workflows.stores.valkey.resp import SERVER_CLOSED, Incomplete, Replies, finish


class LeanAsyncRESP2Parser(AsyncBaseParser):
    """RESP2 replies from an asyncio ``StreamReader`` (see the module docstring)."""

    def __init__(self, socket_read_size: int) -> None:
        self._stream = None
        self._read_size = socket_read_size
        self._replies = Replies()
        self._connected = False
        self.encoder: Encoder | None = None

    def on_connect(self, connection: Any) -> None:
        self._stream = connection._reader
        if self._stream is None:
            raise vex.ValkeyError("Buffer is closed.")
        self.encoder = connection.encoder
        self._replies.clear()
        self._connected = True

    def on_disconnect(self) -> None:
        self._connected = False
        self._replies.clear()

    def stale(self) -> bool:
        """Whether the connection has something to read while nothing was asked (a
        reply left unread, or the server closed it): then it must not be used as is."""
        stream = self._stream
        return (
            self._replies.pending()
            or stream is None
            or stream.at_eof()
            or bool(len(stream._buffer))  # type: ignore[attr-defined]
            or stream.exception() is not None
        )

    async def can_read_destructive(self) -> bool:
        if not self._connected:
            raise vex.ValkeyError("Buffer is closed.")
        return self.stale()

    async def read_response(self, disable_decoding: bool = False, **_: Any) -> Any:
        if not self._connected or self._stream is None:
            raise vex.ConnectionError(SERVER_CLOSED)
        replies = self._replies
        while True:
            if replies.pending():
                try:
                    value = replies.next()
                except Incomplete:
                    pass
                else:
                    return finish(value, self.encoder, disable_decoding)
            data = await self._stream.read(self._read_size)
            if not data:
                raise vex.ConnectionError(SERVER_CLOSED)
            replies.feed(data)


def use_lean_parser(client: Any) -> bool:
    """Make ``client``'s (a ``valkey.asyncio.Valkey``) future connections read with
    :class:`LeanAsyncRESP2Parser`, if it speaks RESP2; whether it does."""
    kwargs = client.connection_pool.connection_kwargs
    if str(kwargs.get("protocol") or 2) != "2" or client.single_connection_client:
        return False
    kwargs["parser_class"] = LeanAsyncRESP2Parser
    return True


async def roundtrip(client: Any, payload: bytes, count: int) -> Any:
    """Send ``payload`` (``count`` packed commands) and read their replies on one
    connection of ``client``'s pool. One command: its reply, an error reply raised.
    Several: the list of replies, an error reply in its place (as a pipeline run with
    ``raise_on_error=False`` returns it). A connection error is raised as valkey-py's
    ``ConnectionError`` (``OSError`` too)."""
    pool = client.connection_pool
    connection = pool.get_available_connection()
    try:
        parser = connection._parser
        if not connection.is_connected:
            await connection.connect()
        elif parser.stale():
            await connection.disconnect()
            await connection.connect()
        writer = connection._writer
        writer.write(payload)
        await writer.drain()
        if count == 1:
            reply = await parser.read_response()
            if isinstance(reply, vex.ResponseError):
                raise reply
            return reply
        return [await parser.read_response() for _ in range(count)]
    except vex.ResponseError:
        raise  # a whole reply was read: the connection is as good as before
    except OSError as exc:
        await connection.disconnect(nowait=True)
        where = connection._host_error()
        raise vex.ConnectionError(f"Error while talking to {where}: {exc}") from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise
    finally:
        await pool.release(connection)


async def execute(client: Any, payload: bytes, name: Any) -> Any:
    """The reply to one packed command ``name`` as ``client.execute_command`` returns it
    (with no options): :func:`roundtrip`'s, through the client's response callback."""
    reply = await roundtrip(client, payload, 1)
    callbacks = client.response_callbacks
    if name in callbacks:
        reply = callbacks[name](reply)
        if inspect.isawaitable(reply):
            reply = await reply
    return reply
