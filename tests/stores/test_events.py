"""Conformance: a batch trigger's event buffer (append_events, read_events,
consume_events) and the named cursors (get_cursor, swap_cursor)."""

from __future__ import annotations

import asyncio
import json

from pyrula.workflows.records import TriggerEvent
from pyrula.workflows.stores.base import Store

from .conftest import START, FakeClock


def payloads(events: list[TriggerEvent]) -> list[str]:
    return [event.payload for event in events]


async def test_an_unknown_trigger_has_no_events(store: Store) -> None:
    assert await store.read_events("nothing", 10) == []
    assert await store.consume_events("nothing", 1, 1) is False


async def test_events_come_back_oldest_first_with_store_time(
    store: Store, clock: FakeClock
) -> None:
    first = await store.append_events("orders", ['{"n": 1}', '{"n": 2}'])
    clock.advance(5)
    second = await store.append_events("orders", ['{"n": 3}'])
    assert len(first) == 2 and len(second) == 1
    assert first[0] < first[1] < second[0]
    events = await store.read_events("orders", 10)
    assert [event.seq for event in events] == first + second
    assert payloads(events) == ['{"n": 1}', '{"n": 2}', '{"n": 3}']
    assert [event.created_at for event in events] == [START, START, START + 5]
    assert payloads(await store.read_events("orders", 2)) == ['{"n": 1}', '{"n": 2}']
    assert await store.read_events("orders", 0) == []


async def test_payloads_are_kept_byte_for_byte(store: Store) -> None:
    odd = [
        '{"big": 123456789012345678901234567890, "empty": [], "obj": {}}',
        '"caf\\u00e9 \u2603 \U0001f600"',
        '"a|b:c\\n\\t"',
        "[]",
        "null",
    ]
    await store.append_events("odd", odd)
    assert payloads(await store.read_events("odd", 10)) == odd


async def test_appending_nothing_appends_nothing(store: Store) -> None:
    assert await store.append_events("quiet", []) == []
    assert await store.read_events("quiet", 10) == []


async def test_triggers_keep_their_events_apart(store: Store) -> None:
    # Names that could collide in a naive key scheme stay apart.
    names = ["a", "a:b", "a:b:c", "b", "a b", "x{y}z", "é"]
    for name in names:
        await store.append_events(name, [json.dumps(name)])
    for name in names:
        events = await store.read_events(name, 10)
        assert payloads(events) == [json.dumps(name)], name


async def test_consume_removes_the_oldest_when_the_head_matches(store: Store) -> None:
    seqs = await store.append_events("t", ["1", "2", "3", "4"])
    assert await store.consume_events("t", seqs[1], 1) is False  # not the oldest
    assert await store.consume_events("t", seqs[0], 5) is False  # fewer than asked
    assert await store.consume_events("t", seqs[0], 0) is False
    assert payloads(await store.read_events("t", 10)) == ["1", "2", "3", "4"]
    assert await store.consume_events("t", seqs[0], 2) is True
    assert payloads(await store.read_events("t", 10)) == ["3", "4"]
    assert await store.consume_events("t", seqs[0], 2) is False  # already consumed
    assert await store.consume_events("t", seqs[2], 2) is True
    assert await store.read_events("t", 10) == []


async def test_seqs_are_never_given_out_twice(store: Store) -> None:
    first = await store.append_events("t", ["1", "2"])
    assert await store.consume_events("t", first[0], 2)
    again = await store.append_events("t", ["3"])
    assert again[0] > first[1]
    assert [event.seq for event in await store.read_events("t", 10)] == again


async def test_concurrent_consumers_remove_a_batch_once(store: Store) -> None:
    seqs = await store.append_events("t", [str(i) for i in range(6)])
    results = await asyncio.gather(*(store.consume_events("t", seqs[0], 3) for _ in range(5)))
    assert sorted(results) == [False] * 4 + [True]
    assert payloads(await store.read_events("t", 10)) == ["3", "4", "5"]


async def test_concurrent_appends_lose_nothing(store: Store) -> None:
    batches = await asyncio.gather(
        *(store.append_events("t", [f'"{i}-{j}"' for j in range(3)]) for i in range(10))
    )
    every = [seq for batch in batches for seq in batch]
    assert len(set(every)) == 30
    events = await store.read_events("t", 100)
    assert [event.seq for event in events] == sorted(every)
    for batch in batches:  # each append's events stay in their order
        positions = [every.index(seq) for seq in batch]
        assert positions == sorted(positions)


async def test_cursors_compare_and_set(store: Store) -> None:
    assert await store.get_cursor("p") is None
    assert await store.swap_cursor("p", "x", "1") is False  # expected a value: there is none
    assert await store.get_cursor("p") is None
    assert await store.swap_cursor("p", None, "1") is True
    assert await store.get_cursor("p") == "1"
    assert await store.swap_cursor("p", None, "2") is False  # it exists now
    assert await store.swap_cursor("p", "0", "2") is False
    assert await store.swap_cursor("p", "1", '[1700000000.5, "run|x"]') is True
    assert await store.get_cursor("p") == '[1700000000.5, "run|x"]'
    assert await store.get_cursor("q") is None  # cursors are apart


async def test_concurrent_swaps_let_one_win(store: Store) -> None:
    await store.swap_cursor("p", None, "0")
    results = await asyncio.gather(*(store.swap_cursor("p", "0", str(i)) for i in range(1, 6)))
    assert results.count(True) == 1
    winner = results.index(True) + 1
    assert await store.get_cursor("p") == str(winner)


async def test_cursor_and_trigger_names_do_not_collide(store: Store) -> None:
    await store.append_events("same", ["1"])
    assert await store.swap_cursor("same", None, "c")
    assert payloads(await store.read_events("same", 10)) == ["1"]
    assert await store.get_cursor("same") == "c"
