"""The asyncio RESP2 parser of the store's async clients (``stores/valkey/aio.py``):
every reply kind of the blocking parser's table, replies split anywhere across reads,
big bulk strings arriving in many pieces, errors as valkey-py returns or raises them.
Over an ``asyncio.StreamReader`` fed by hand; no server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from valkey import exceptions as vex
from valkey._parsers import Encoder

from pyrula.workflows.stores.valkey.aio import LeanAsyncRESP2Parser
from tests.unit.test_resp import REPLIES


class FakeConnection:
    """What the parser reads off a valkey-py asyncio Connection when it connects."""

    def __init__(self, decode: bool = False) -> None:
        self._reader = asyncio.StreamReader()
        self.encoder = Encoder("utf-8", "strict", decode)


def connected(read_size: int = 65536, decode: bool = False) -> tuple[LeanAsyncRESP2Parser, Any]:
    connection = FakeConnection(decode)
    parser = LeanAsyncRESP2Parser(socket_read_size=read_size)
    parser.on_connect(connection)
    return parser, connection._reader


async def feed_later(stream: asyncio.StreamReader, chunks: list[bytes]) -> None:
    for chunk in chunks:
        await asyncio.sleep(0)
        stream.feed_data(chunk)


@pytest.mark.parametrize(("wire", "value"), REPLIES)
async def test_every_reply_whole_and_split_anywhere(wire: bytes, value: Any) -> None:
    parser, stream = connected()
    stream.feed_data(wire)
    assert await parser.read_response() == value
    assert not parser.stale()
    for cut in range(1, len(wire)):
        parser, stream = connected()
        feeding = asyncio.ensure_future(feed_later(stream, [wire[:cut], wire[cut:]]))
        assert await parser.read_response() == value
        await feeding
        assert not parser.stale()


async def test_replies_that_share_a_read_are_returned_one_by_one() -> None:
    parser, stream = connected(read_size=7)
    wires = [wire for wire, _ in REPLIES]
    stream.feed_data(b"".join(wires))
    for _, value in REPLIES:
        assert await parser.read_response() == value
    assert not parser.stale()


async def test_a_big_bulk_string_arrives_in_many_reads() -> None:
    big = bytes(range(256)) * 4096  # 1 MiB, CRLFs and all
    wire = b"*3\r\n$%d\r\n%s\r\n$-1\r\n:7\r\n" % (len(big), big)
    parser, stream = connected(read_size=65536)
    chunks = [wire[i : i + 10_000] for i in range(0, len(wire), 10_000)]
    feeding = asyncio.ensure_future(feed_later(stream, chunks))
    assert await parser.read_response() == [big, None, 7]
    await feeding


async def test_error_replies_are_returned_and_connection_errors_raised() -> None:
    parser, stream = connected()
    stream.feed_data(b"-ERR PYRULA_LEASE gone\r\n*2\r\n:1\r\n-NOSCRIPT no such script\r\n")
    error = await parser.read_response()
    assert type(error) is vex.ResponseError and str(error) == "PYRULA_LEASE gone"
    nested = await parser.read_response()
    assert nested[0] == 1 and isinstance(nested[1], vex.NoScriptError)
    stream.feed_data(b"-ERR max number of clients reached\r\n")
    with pytest.raises(vex.ConnectionError):
        await parser.read_response()
    stream.feed_data(b"?what\r\n")
    with pytest.raises(vex.InvalidResponse):
        await parser.read_response()


async def test_a_reply_cut_by_the_server_closing_raises() -> None:
    parser, stream = connected()
    stream.feed_data(b"$10\r\nhal")
    stream.feed_eof()
    with pytest.raises(vex.ConnectionError):
        await parser.read_response()


async def test_stale_says_when_something_waits_unasked() -> None:
    parser, stream = connected()
    assert not parser.stale() and not await parser.can_read_destructive()
    stream.feed_data(b"+late\r\n")
    assert parser.stale()
    assert await parser.read_response() == b"late"
    assert not parser.stale()
    stream.feed_data(b"+a\r\n+b\r\n")
    assert await parser.read_response() == b"a"
    assert parser.stale()  # b is buffered by the parser, unasked
    stream.feed_eof()
    assert await parser.read_response() == b"b"
    assert parser.stale()  # closed by the server
    parser.on_disconnect()
    with pytest.raises(vex.ConnectionError):
        await parser.read_response()


async def test_replies_are_decoded_when_the_client_decodes() -> None:
    parser, stream = connected(decode=True)
    stream.feed_data(b"*2\r\n$2\r\n\xc3\xa9\r\n:3\r\n")
    assert await parser.read_response() == ["é", 3]
    stream.feed_data(b"$2\r\n\xc3\xa9\r\n")
    assert await parser.read_response(disable_decoding=True) == b"\xc3\xa9"
