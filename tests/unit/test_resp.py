"""The lean RESP2 parser and packer of the blocking fast path (``stores/valkey/resp.py``):
the same values as valkey-py's own, replies split anywhere across reads, and the
errors valkey-py raises. Over a local socket pair; no server."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from valkey import exceptions as vex
from valkey._parsers import Encoder
from valkey.connection import PythonRespSerializer

from pyrula.workflows.stores.valkey.resp import Incomplete, LeanRESP2Parser, pack_command, parse

REPLIES: list[tuple[bytes, Any]] = [
    (b"+OK\r\n", b"OK"),
    (b":42\r\n", 42),
    (b":-7\r\n", -7),
    (b"$5\r\nhello\r\n", b"hello"),
    (b"$0\r\n\r\n", b""),
    (b"$-1\r\n", None),
    (b"*-1\r\n", None),
    (b"*0\r\n", []),
    (b"$4\r\na\r\nb\r\n", b"a\r\nb"),  # CRLF inside a bulk string
    (
        b"*4\r\n*2\r\n$7\r\ncreated\r\n$3\r\n\xc3\xa9x\r\n*0\r\n*-1\r\n:1\r\n",
        [[b"created", "éx".encode()], [], None, 1],
    ),
    (b"*3\r\n$2\r\nwf\r\n$-1\r\n+x\r\n", [b"wf", None, b"x"]),
]


def bulks(*items: bytes | None) -> bytes:
    wire = b"*%d\r\n" % len(items)
    for item in items:
        wire += b"$-1\r\n" if item is None else b"$%d\r\n%s\r\n" % (len(item), item)
    return wire


HASH = [b"wf", b"noop", b"p", b'{"args":[]}', b"st", b"completed", b"rs", b"", b"er", b"x"]
# Arrays long enough for the split-based reading of an HGETALL, and the ones it must
# hand back to the general loop (a value holding CRLF, a nil, an element of another kind).
REPLIES += [
    (bulks(*HASH), HASH),
    (bulks(*HASH[:6], b"a\r\n$1\r\nb", *HASH[6:]), [*HASH[:6], b"a\r\n$1\r\nb", *HASH[6:]]),
    (bulks(*HASH[:6], b"\r\n", *HASH[6:]), [*HASH[:6], b"\r\n", *HASH[6:]]),
    (bulks(*HASH[:3], None, *HASH[3:]), [*HASH[:3], None, *HASH[3:]]),
    (
        b"*9\r\n" + bulks(*HASH[:2])[4:] + b":5\r\n" + bulks(*HASH[:6])[4:],
        [*HASH[:2], 5, *HASH[:6]],
    ),
]


@pytest.mark.parametrize(("wire", "value"), REPLIES)
def test_parse_whole_and_cut_anywhere(wire: bytes, value: Any) -> None:
    assert parse(wire, 0) == (value, len(wire))
    assert parse(b"junk" + wire + b"+next\r\n", 4) == (value, 4 + len(wire))
    for cut in range(len(wire)):
        with pytest.raises(Incomplete):
            parse(wire[:cut], 0)


def test_errors_become_valkey_py_exceptions() -> None:
    wire = b"-ERR PYRULA_STATE run x is done\r\n"
    error, end = parse(wire, 0)
    assert type(error) is vex.ResponseError and str(error) == "PYRULA_STATE run x is done"
    assert end == len(wire)
    nested, _ = parse(b"*2\r\n:1\r\n-NOSCRIPT no such script\r\n", 0)
    assert nested[0] == 1 and isinstance(nested[1], vex.NoScriptError)
    with pytest.raises(vex.InvalidResponse):
        parse(b"?what\r\n", 0)


@pytest.mark.parametrize(
    "args",
    [
        ("FCALL", "pyrula_abc_create", 1, "ns:{ns:3}:", "", "ns", "3", "run", '{"a":1}'),
        ("SET", "k", "é and ☃", b"\x00\xff raw"),
        ("GET", "k" * 70_000),
        ("BLMOVE", "a", "a", "RIGHT", "LEFT", "0.250"),
    ],
)
def test_pack_command_sends_what_valkey_py_sends(args: tuple[Any, ...]) -> None:
    encoder = Encoder("utf-8", "strict", False)
    expected = b"".join(PythonRespSerializer(6000, encoder.encode).pack(*args))
    assert pack_command(args) == expected


def test_pack_command_refuses_what_it_cannot_send() -> None:
    for bad in (1.5, None, True, object()):
        with pytest.raises(TypeError):
            pack_command(("SET", "k", bad))


class FakeConnection:
    """What the parser reads off a valkey-py Connection when it connects."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.encoder = Encoder("utf-8", "strict", False)


@pytest.fixture
def pair() -> Iterator[tuple[LeanRESP2Parser, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(5)
    parser = LeanRESP2Parser(socket_read_size=7)  # tiny reads: replies arrive in pieces
    parser.on_connect(FakeConnection(ours))
    try:
        yield parser, theirs
    finally:
        parser.on_disconnect()
        ours.close()
        theirs.close()


def test_replies_read_in_pieces_and_back_to_back(
    pair: tuple[LeanRESP2Parser, socket.socket],
) -> None:
    parser, server = pair
    wire = b"".join(w for w, _ in REPLIES)

    def send_slowly() -> None:
        for i in range(0, len(wire), 5):
            server.sendall(wire[i : i + 5])

    sender = threading.Thread(target=send_slowly)
    sender.start()
    try:
        assert [parser.read_response() for _ in REPLIES] == [v for _, v in REPLIES]
    finally:
        sender.join(10)
    assert not parser.can_read(0)
    server.sendall(b"+PONG\r\n:1\r\n")
    assert parser.can_read(1)
    assert parser.read_response() == b"PONG"
    assert parser.can_read(0)  # the second reply is buffered already
    assert parser.read_response() == 1


def test_an_error_reply_is_returned_and_the_next_one_still_read(
    pair: tuple[LeanRESP2Parser, socket.socket],
) -> None:
    parser, server = pair
    server.sendall(b"-ERR Function not found\r\n$2\r\nok\r\n")
    error = parser.read_response()
    assert isinstance(error, vex.ResponseError) and "Function not found" in str(error)
    assert parser.read_response() == b"ok"


def test_a_connection_error_reply_is_raised(pair: tuple[LeanRESP2Parser, socket.socket]) -> None:
    parser, server = pair
    server.sendall(b"-ERR max number of clients reached\r\n")
    with pytest.raises(vex.ConnectionError):
        parser.read_response()


def test_closed_and_silent_servers(pair: tuple[LeanRESP2Parser, socket.socket]) -> None:
    parser, server = pair
    assert parser._sock is not None
    parser._sock.settimeout(0.2)
    with pytest.raises(vex.TimeoutError):
        parser.read_response()
    server.sendall(b"$10\r\nonly")  # half a reply, then the server goes away
    server.close()
    with pytest.raises(vex.ConnectionError):
        parser.read_response()


@pytest.mark.parametrize("shape", ["bulk", "hgetall"])
def test_a_big_reply_in_many_reads_is_parsed_a_bounded_number_of_times(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply arriving in many reads is parsed again only once enough bytes came for the
    part it stopped at: a 4 MiB value in 64 KiB reads is parsed a few times, not once per
    read (each parse walks and copies the whole buffer: quadratic time in the size)."""
    from pyrula.workflows.stores.valkey import resp

    big = b"x" * (4 * 1024 * 1024)
    if shape == "bulk":
        wire, value = b"$%d\r\n%s\r\n" % (len(big), big), big
    else:  # a run record: short fields around one big value, then another
        fields = [b"wf", b"w", b"p", big, b"st", b"queued", b"r", big, b"id", b"r1"]
        wire, value = bulks(*fields), fields
    calls = 0
    real_parse = resp.parse

    def counting(buf: bytes, pos: int) -> tuple[Any, int]:
        nonlocal calls
        calls += 1
        return real_parse(buf, pos)

    monkeypatch.setattr(resp, "parse", counting)
    replies = resp.Replies()
    chunk, got = 64 * 1024, []
    for start in range(0, len(wire), chunk):
        replies.feed(wire[start : start + chunk])
        with contextlib.suppress(Incomplete):
            got.append(replies.next())
    assert got == [value] and not replies.pending()
    assert calls <= 4, f"{calls} parses for {len(wire) // chunk + 1} reads"
