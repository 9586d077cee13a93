"""Batch-trigger buffers and cursors, what only Valkey shows (the behaviour every store
shares is tests/stores/test_events.py): each trigger's keys share one cluster slot, big
payloads, long batches, memory left behind, and namespaces kept apart."""

from __future__ import annotations

import json
from typing import Any

from pyrula.workflows.stores.valkey.keys import Keys
from tests.valkey.servers import ValkeyClusterProcesses, ValkeyProcess

from .conftest import MakeStore

ODD_NAMES = ["a", "x{y}z", "{", "}", "a}:b", "}{", "é", "ev:1:a}:n", "cur:1:a"]


def keyslot(client: Any, key: str) -> int:
    return int(client.execute_command("CLUSTER", "KEYSLOT", key))


def test_a_triggers_keys_share_one_slot(valkey_cluster: ValkeyClusterProcesses) -> None:
    keys = Keys("ns", 4)
    client: Any = valkey_cluster.nodes[0].client()
    try:
        slots = set()
        for name in ODD_NAMES:
            events, seq = keys.trigger_events(name), keys.trigger_seq(name)
            assert events.startswith(keys.trigger(name)) and seq.startswith(keys.trigger(name))
            assert keyslot(client, events) == keyslot(client, seq), name
            slots.add(keyslot(client, events))
            slots.add(keyslot(client, keys.cursor(name)))
        assert len(slots) > len(ODD_NAMES)  # a tag per trigger and per cursor: spread out
    finally:
        client.close()


def test_no_two_names_share_a_key() -> None:
    keys = Keys("ns", 4)
    every = [
        key
        for name in ODD_NAMES
        for key in (keys.trigger_events(name), keys.trigger_seq(name), keys.cursor(name))
    ]
    assert len(set(every)) == len(every)


async def test_odd_names_on_a_cluster(make_store: MakeStore) -> None:
    store = await make_store("cluster", shard_count=1)
    for name in ODD_NAMES:
        seqs = await store.append_events(name, [json.dumps(name)])
        assert await store.swap_cursor(name, None, name)
        assert [e.payload for e in await store.read_events(name, 5)] == [json.dumps(name)]
        assert await store.consume_events(name, seqs[0], 1)
    for name in ODD_NAMES:
        assert await store.get_cursor(name) == name
        assert await store.read_events(name, 5) == []


async def test_a_100000_byte_payload_round_trips(make_store: MakeStore, topology: str) -> None:
    store = await make_store(topology, shard_count=1)
    big = json.dumps("é|" + "x" * 99_995, ensure_ascii=False)
    assert len(big.encode()) == 100_000
    seqs = await store.append_events("big", ["1", big, "3"])
    events = await store.read_events("big", 10)
    assert [e.payload for e in events] == ["1", big, "3"]
    assert await store.consume_events("big", seqs[0], 2)
    assert [e.payload for e in await store.read_events("big", 10)] == ["3"]
    assert await store.swap_cursor("big", None, big)
    assert await store.get_cursor("big") == big


async def test_a_batch_longer_than_one_push_keeps_its_order(
    make_store: MakeStore, topology: str
) -> None:
    # lua/common.lua's call_many pushes 4,000 entries per RPUSH.
    store = await make_store(topology, shard_count=1)
    payloads = [str(i) for i in range(9_001)]
    seqs = await store.append_events("long", payloads)
    assert seqs == list(range(seqs[0], seqs[0] + 9_001))
    events = await store.read_events("long", 10_000)
    assert [e.payload for e in events] == payloads
    assert [e.seq for e in events] == seqs
    assert [e.payload for e in await store.read_events("long", 3)] == ["0", "1", "2"]


async def test_consumed_events_leave_only_the_counter(
    valkey_server: ValkeyProcess, make_store: MakeStore
) -> None:
    store = await make_store("single", shard_count=1)
    seqs = await store.append_events("t", ["1", "2"])
    client: Any = valkey_server.client()
    try:
        keys = store._keys
        assert client.ttl(keys.trigger_events("t")) == -1  # no TTL: kept until consumed
        assert await store.consume_events("t", seqs[0], 2)
        assert client.exists(keys.trigger_events("t")) == 0
        assert client.get(keys.trigger_seq("t")) == str(seqs[1]).encode()
    finally:
        client.close()


async def test_namespaces_keep_events_and_cursors_apart(
    make_store: MakeStore, topology: str
) -> None:
    one = await make_store(topology, shard_count=1)
    two = await make_store(topology, shard_count=1)
    seqs = await one.append_events("t", ["1", "2"])
    assert await one.swap_cursor("c", None, "one")
    assert await two.read_events("t", 10) == []
    assert await two.consume_events("t", seqs[0], 1) is False
    assert await two.get_cursor("c") is None
    assert await two.swap_cursor("c", "one", "two") is False
    assert await two.swap_cursor("c", None, "two")
    assert (await two.append_events("t", ["3"]))[0] == seqs[0]  # its own counter
    assert [e.payload for e in await one.read_events("t", 10)] == ["1", "2"]
    assert [e.payload for e in await two.read_events("t", 10)] == ["3"]
    assert await one.get_cursor("c") == "one"
    assert await two.get_cursor("c") == "two"
