"""The lean asyncio path of a single-node store (``stores/valkey/aio.py``) against a real
valkey-server: the store's client reads every command through the lean parser, FCALLs
go through ``roundtrip``; replies of every kind, a server error in the middle of a
pipeline, and a cancelled read that must leave no half-read connection in the pool."""

from __future__ import annotations

import asyncio

import pytest
import valkey.asyncio as valkey_async
from valkey import exceptions as vex

from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.aio import LeanAsyncRESP2Parser, roundtrip, use_lean_parser
from pyrula.workflows.stores.valkey.resp import pack_command
from tests.valkey.conftest import MakeStore
from tests.valkey.servers import ValkeyProcess, fresh_namespace


def packed(*commands: tuple[object, ...]) -> bytes:
    return b"".join(pack_command(command) for command in commands)


async def test_a_single_node_store_reads_through_the_lean_parser(make_store: MakeStore) -> None:
    store = await make_store()
    client = store._server.client()
    assert client.connection_pool.connection_kwargs["parser_class"] is LeanAsyncRESP2Parser
    assert id(client) in store._server._lean
    key = f"{store._keys.shard(0)}lean"
    big = bytes(range(256)) * 2048  # 512 KiB: many reads
    assert await client.execute_command("SET", key, big) is True  # valkey-py's callback
    assert await client.execute_command("GET", key) == big
    await client.execute_command("HSET", f"{key}:h", "a", "1", "b", "")
    assert await client.execute_command("HGETALL", f"{key}:h") == {b"a": b"1", b"b": b""}
    nested = "return {1, {'x', {2, false}}, 'y'}"
    assert await client.execute_command("EVAL", nested, 0) == [1, [b"x", [2, None]], b"y"]
    assert await client.execute_command("GET", f"{key}:none") is None
    with pytest.raises(vex.ResponseError, match="WRONGTYPE"):
        await client.execute_command("LPUSH", f"{key}:h", "x")
    connection = client.connection_pool._available_connections[-1]
    assert isinstance(connection._parser, LeanAsyncRESP2Parser)
    # Server.command takes the lean path and returns what execute_command returns.
    server = store._server
    assert await server.command("HGETALL", f"{key}:h") == {b"a": b"1", b"b": b""}
    assert await server.command("SET", key, "v") is True
    seconds, micros = await server.command("TIME")
    assert isinstance(seconds, int) and isinstance(micros, int)
    await server.command("RPUSH", f"{key}:l", "x")
    assert await server.command("BLPOP", f"{key}:l", "1", block=1.0) == (
        f"{key}:l".encode(),
        b"x",
    )
    assert await server.command("BLPOP", f"{key}:l", 0.05, block=1.0) is None  # a float
    await client.execute_command("DEL", key, f"{key}:h")


async def test_roundtrip_replies_and_an_error_mid_pipeline(make_store: MakeStore) -> None:
    store = await make_store()
    client = store._server.client()
    key = f"{store._keys.shard(0)}rt"
    big = b"v" * 300_000
    assert await roundtrip(client, packed(("SET", key, big)), 1) == b"OK"
    replies = await roundtrip(
        client,
        packed(("GET", key), ("INCR", key), ("GET", f"{key}:none"), ("ECHO", "after")),
        4,
    )
    assert replies[0] == big
    assert isinstance(replies[1], vex.ResponseError) and "not an integer" in str(replies[1])
    assert replies[2:] == [None, b"after"]
    with pytest.raises(vex.ResponseError):
        await roundtrip(client, packed(("INCR", key)), 1)
    # The errors were whole replies: the same connection serves the next command.
    pool = client.connection_pool
    before = list(pool._available_connections)
    assert await roundtrip(client, packed(("PING",)), 1) == b"PONG"
    assert pool._available_connections == before
    assert not pool._in_use_connections
    await roundtrip(client, packed(("DEL", key)), 1)


async def test_a_cancelled_read_leaves_no_half_read_connection(make_store: MakeStore) -> None:
    store = await make_store()
    client = store._server.client()
    pool = client.connection_pool
    key = f"{store._keys.shard(0)}cancel"
    waiting = asyncio.ensure_future(roundtrip(client, packed(("BLPOP", key, "2")), 1))
    await asyncio.sleep(0.2)  # sent and blocked on the server
    (connection,) = pool._in_use_connections
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not connection.is_connected  # dropped, not pooled with a reply on its way
    assert connection in pool._available_connections and not pool._in_use_connections
    # The reply the blocked command would have had goes nowhere: pushing now feeds
    # nobody on that connection, and the next command reads its own reply.
    await roundtrip(client, packed(("RPUSH", key, "x")), 1)
    assert await roundtrip(client, packed(("ECHO", "mine")), 1) == b"mine"
    assert await roundtrip(client, packed(("LRANGE", key, "0", "-1")), 1) == [b"x"]
    await roundtrip(client, packed(("DEL", key)), 1)


async def test_a_pooled_connection_with_an_unread_reply_is_replaced(
    make_store: MakeStore,
) -> None:
    store = await make_store()
    client = store._server.client()
    assert await roundtrip(client, packed(("PING",)), 1) == b"PONG"
    (connection,) = client.connection_pool._available_connections
    connection._writer.write(packed(("ECHO", "stray")))  # a reply nobody will ask for
    await asyncio.sleep(0.1)
    assert await roundtrip(client, packed(("ECHO", "mine")), 1) == b"mine"


async def test_a_call_after_the_server_closed_the_connection(
    valkey_server: ValkeyProcess,
) -> None:
    store = ValkeyStore(valkey_server.url, namespace=fresh_namespace())
    await store.open()
    try:
        client = store._server.client()
        my_id = await roundtrip(client, packed(("CLIENT", "ID")), 1)
        valkey_server.client().client_kill_filter(_id=my_id)
        await asyncio.sleep(0.1)
        assert await roundtrip(client, packed(("ECHO", "again")), 1) == b"again"
        assert await store.get_run("nope") is None  # the store's own calls go on too
    finally:
        await store.close()


async def test_resp3_clients_keep_valkey_pys_parser(valkey_server: ValkeyProcess) -> None:
    client = valkey_async.Valkey.from_url(f"{valkey_server.url}?protocol=3")
    try:
        assert not use_lean_parser(client)
        assert client.connection_pool.connection_kwargs.get("parser_class") is not (
            LeanAsyncRESP2Parser
        )
    finally:
        await client.aclose()
    plain = valkey_async.Valkey.from_url(valkey_server.url)
    try:
        assert use_lean_parser(plain)
        assert await plain.execute_command("ECHO", "x") == b"x"
    finally:
        await plain.aclose()
