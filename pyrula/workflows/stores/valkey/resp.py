"""A lean RESP2 reply parser for valkey-py's blocking connections.

valkey-py's pure-Python parser reads a reply one line at a time through a ``BytesIO``
(several calls and a ``bytes.endswith`` per element), which makes an ``HGETALL`` of a
run record (about fifty elements) cost more CPU than the round trip itself. This parser
keeps what the socket returned in one ``bytes`` buffer and walks it by index; a reply
that has not fully arrived is parsed again from its start once enough bytes are in (see
:class:`Replies`). Replies are the same values as
valkey-py's RESP2 parser returns (bytes, int, None, lists, an error as an
exception instance), so it is
passed as ``parser_class`` to a ``valkey.Connection`` and nothing else changes.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable, Sequence
from typing import Any, cast

from valkey import exceptions as vex
from valkey._parsers import BaseParser, Encoder

SERVER_CLOSED = "Connection closed by server."
_CRLF = b"\r\n"
_BULK, _ARRAY, _INT, _SIMPLE, _ERROR = b"$"[0], b"*"[0], b":"[0], b"+"[0], b"-"[0]


class Incomplete(Exception):
    """The buffer ends before the reply does. ``need``: how long the buffer (from its
    start) must be before the parse can get further; 0 when any more bytes may do."""

    def __init__(self, need: int = 0) -> None:
        super().__init__(need)
        self.need = need


parse_error = cast(Callable[[str], Exception], BaseParser.parse_error)
"""valkey-py's mapping of an error reply to its exception class (``NOSCRIPT`` ...)."""


class Replies:
    """Bytes read from a connection, and the replies in them: what the blocking and the
    asyncio parsers share. :meth:`next` parses the reply at the read position or raises
    Incomplete (nothing consumed: it is parsed again from its start once :meth:`feed`
    added what came next).

    A reply that has not fully arrived is parsed again only once enough has come for the
    part it stopped at (the length a bulk string's header declares): until then what
    arrives is kept in a list and joined once, so a reply of many megabytes, arriving in
    64 KiB reads, costs time linear in its size (joining and parsing it at each read made
    a 10 MB value take seconds)."""

    __slots__ = ("_need", "_parts", "_parts_size", "buf", "pos")

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.buf, self.pos = b"", 0
        self._parts: list[bytes] = []
        self._parts_size = 0
        self._need = 0
        """Bytes from ``pos`` the next parse needs (0: any)."""

    def pending(self) -> bool:
        """Whether bytes not yet parsed are buffered."""
        return self.pos < len(self.buf) or bool(self._parts)

    def feed(self, data: bytes) -> None:
        self._parts.append(data)
        self._parts_size += len(data)

    def next(self) -> Any:
        """The next reply (an error reply as an exception instance), or Incomplete."""
        parts = self._parts
        if parts:
            pos = self.pos
            if len(self.buf) - pos + self._parts_size < self._need:
                raise Incomplete
            if pos < len(self.buf):
                parts.insert(0, self.buf[pos:])
            self.buf = parts[0] if len(parts) == 1 else b"".join(parts)
            self.pos = self._parts_size = 0
            parts.clear()
        buf, pos = self.buf, self.pos
        try:
            value, end = parse(buf, pos)
        except Incomplete as exc:
            self._need = (exc.need or len(buf) + 1) - pos
            raise
        except (ValueError, IndexError):
            raise vex.InvalidResponse(f"Protocol error: {buf[pos:][:80]!r}") from None
        self._need = 0
        if end >= len(buf):
            self.buf, self.pos = b"", 0
        else:
            self.pos = end
        return value


class LeanRESP2Parser(BaseParser):
    """RESP2 over a plain ``bytes`` buffer (see the module docstring)."""

    def __init__(self, socket_read_size: int) -> None:
        self.socket_read_size = socket_read_size
        self._sock: socket.socket | None = None
        self._replies = Replies()
        self.encoder: Encoder | None = None

    def on_connect(self, connection: Any) -> None:
        self._sock = connection._sock
        self._replies.clear()
        self.encoder = connection.encoder

    def on_disconnect(self) -> None:
        self._sock = None
        self._replies.clear()

    def can_read(self, timeout: float | None) -> bool:
        """Whether a reply (or part of one) is waiting: buffered here or on the socket."""
        if self._replies.pending():
            return True
        sock = self._sock
        if sock is None:
            return False
        pending = getattr(sock, "pending", None)  # TLS: bytes already decrypted
        if pending is not None and pending():
            return True
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0 if not timeout else int(timeout * 1000)))

    def read_response(self, disable_decoding: bool = False, **_: Any) -> Any:
        replies = self._replies
        if not replies.pending():
            self._fill()  # the usual case: nothing buffered yet
        while True:
            try:
                value = replies.next()
            except Incomplete:
                self._fill()
                continue
            return finish(value, self.encoder, disable_decoding)

    def _fill(self) -> None:
        sock = self._sock
        if sock is None:
            raise vex.ConnectionError(SERVER_CLOSED)
        try:
            data = sock.recv(self.socket_read_size)
        except TimeoutError:  # socket.timeout
            raise vex.TimeoutError("Timeout reading from socket") from None
        if not data:
            raise vex.ConnectionError(SERVER_CLOSED)
        self._replies.feed(data)


def finish(value: Any, encoder: Encoder | None, disable_decoding: bool) -> Any:
    """A parsed reply as a parser returns it: a connection error raised (any other error
    reply is returned, as valkey-py's parsers do), decoded if the client decodes."""
    if isinstance(value, vex.ConnectionError):
        raise value
    if not disable_decoding and encoder is not None and encoder.decode_responses:
        return _decoded(value, encoder)
    return value


def parse(buf: bytes, pos: int) -> tuple[Any, int]:
    """The reply starting at ``buf[pos]`` and where it ends; Incomplete if it does not
    end within ``buf``."""
    end = buf.find(_CRLF, pos)
    if end < 0:
        raise Incomplete
    kind = buf[pos]
    if kind == _BULK:
        size = int(buf[pos + 1 : end])
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if stop + 2 > len(buf):
            raise Incomplete(stop + 2)
        return buf[end + 2 : stop], stop + 2
    if kind == _ARRAY:
        count = int(buf[pos + 1 : end])
        if count < 0:
            return None, end + 2
        pos = end + 2
        if count >= 8:
            flat = _bulk_strings(buf, pos, count)
            if flat is not None:
                return flat
        items: list[Any] = []
        append = items.append
        size_buf = len(buf)
        for _ in range(count):
            if pos < size_buf and buf[pos] == _BULK:  # the common case, inline
                end = buf.find(_CRLF, pos)
                if end < 0:
                    raise Incomplete
                size = int(buf[pos + 1 : end])
                if size < 0:
                    append(None)
                    pos = end + 2
                    continue
                stop = end + 2 + size
                if stop + 2 > size_buf:
                    raise Incomplete(stop + 2)
                append(buf[end + 2 : stop])
                pos = stop + 2
            else:
                item, pos = parse(buf, pos)
                append(item)
        return items, pos
    if kind == _INT:
        return int(buf[pos + 1 : end]), end + 2
    if kind == _SIMPLE:
        return buf[pos + 1 : end], end + 2
    if kind == _ERROR:
        message = buf[pos + 1 : end].decode("utf-8", errors="replace")
        return parse_error(message), end + 2
    raise vex.InvalidResponse(f"Protocol error: {buf[pos:end]!r}")


def _bulk_strings(buf: bytes, pos: int, count: int) -> tuple[list[bytes], int] | None:
    """An array of ``count`` bulk strings from ``pos`` (an HGETALL), with C-speed
    splitting; None when it is not one, or has a value holding CRLF, or is incomplete
    (the general loop then reads it).

    Split at the first ``2 * count`` CRLFs, the parts alternate header and value. Each
    header checked equal to ``$<length of the value after it>`` proves the split is the
    real framing: a header holds no CRLF, and a value that did would be cut short of the
    length its header declares."""
    parts = buf[pos:].split(_CRLF, 2 * count)
    if len(parts) <= 2 * count:
        return None  # not all there yet
    values = parts[1 : 2 * count : 2]
    if parts[0 : 2 * count : 2] != [b"$%d" % len(value) for value in values]:
        return None
    return values, len(buf) - len(parts[-1])


def _decoded(value: Any, encoder: Encoder) -> Any:
    if isinstance(value, list):
        return [_decoded(item, encoder) for item in value]
    if isinstance(value, bytes):
        return cast(Callable[[bytes], Any], encoder.decode)(value)
    return value


def pack_command(args: Sequence[Any]) -> bytes:
    """A command as RESP2 bytes. Arguments are ``str`` (sent as UTF-8), ``bytes`` or
    ``int``. Cheaper than valkey-py's general packer, in which the store's calls (up to
    twenty short strings) spent most of their client time: an all-ASCII command is
    formatted as one string and encoded once."""
    parts: list[str] = []
    append = parts.append
    for arg in args:
        if type(arg) is not str:
            if not isinstance(arg, int) or isinstance(arg, bool):
                return _pack_bytes(args)
            arg = str(arg)
        append(f"${len(arg)}\r\n{arg}\r\n")
    text = "".join(parts)
    if text.isascii():  # lengths in characters are lengths in bytes
        return f"*{len(args)}\r\n{text}".encode()
    return _pack_bytes(args)


def _pack_bytes(args: Sequence[Any]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    append = out.append
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, int) and not isinstance(arg, bool):
            data = b"%d" % arg
        else:
            raise TypeError(f"cannot send {arg!r} to Valkey: str, bytes or int only")
        append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)
