"""Run ids, idempotency keys and owners with non-ASCII text, glob and hash-tag
characters, newlines and quotes, on every store (reliability plan, scenario 29
and security items 1 and 4).

Expect each to be accepted and round-tripped exactly, NFC and NFD spellings to be two
different keys (no normalisation), a glob character never to widen a lookup, and the
Lua library on the server never to change whatever the data (no Lua built from strings).
A string that cannot be stored everywhere (a lone surrogate, or a NUL character, which
Postgres text and so the archive cannot hold) is refused at submit with ``InvalidParams``,
leaving nothing behind, the same on every store.
"""

from __future__ import annotations

import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pyrula.workflows import (
    InlineWorkflowRunner,
    InvalidParams,
    MemoryStore,
    RunStatus,
    SqliteStore,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.base import Store
from pyrula.workflows.stores.valkey import ValkeyStore
from tests.valkey.servers import ValkeyProcess, fresh_namespace

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")
ODD = [
    "ключ",
    "🔑",
    NFC,
    NFD,
    ": { } * ? [ ] \n '",
    "x" * 990,  # long, within the 1,000-character limit once prefixed
    "a*",
    "*",
    "{x}",
    "a:b",
    '"]] -- redis.call("FLUSHALL")',
]

registry = Registry()


@workflow(registry=registry, name="odd.echo")
async def echo(ctx: WorkflowContext, n: int) -> int:
    return int(await ctx.step("twice", lambda: n * 2))


def _missing(run_id: str) -> Any:
    raise AssertionError(f"run {run_id!r} is gone")


@pytest.fixture(params=["memory", "sqlite", "valkey"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    store: Store
    if request.param == "memory":
        store = MemoryStore()
    elif request.param == "sqlite":
        store = SqliteStore(tmp_path / "odd.db")
    else:
        server = request.getfixturevalue("valkey_server")
        assert isinstance(server, ValkeyProcess)
        store = ValkeyStore(server.url, namespace=fresh_namespace(), shard_count=4)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_odd_ids_keys_and_owners_round_trip_exactly(any_store: Store) -> None:
    runner = InlineWorkflowRunner(any_store, registry=registry)
    client = runner.client
    ids: dict[str, str] = {}
    for n, text in enumerate(ODD):
        handle = await client.submit("odd.echo", {"n": n}, run_id=text)
        keyed = await client.submit("odd.echo", {"n": n}, idempotency_key=text, owner=text)
        again = await client.submit("odd.echo", {"n": n}, idempotency_key=text, owner=text)
        assert again.run_id == keyed.run_id  # the same key: the same run
        record = await handle.record()
        assert record.run_id == text  # byte for byte
        keyed_record = await keyed.record()
        assert keyed_record.idempotency_key == text and keyed_record.owner == text
        ids[text] = keyed.run_id
    # No normalisation: NFC and NFD are two ids and two keys.
    assert ids[NFC] != ids[NFD]
    params = {(await any_store.get_run(text) or _missing(text)).params for text in (NFC, NFD)}
    assert params == {f'{{"n":{ODD.index(NFC)}}}', f'{{"n":{ODD.index(NFD)}}}'}
    # Every run executes, journals and ends under its odd id.
    for n, text in enumerate(ODD):
        assert await runner.execute(client.handle("odd.echo", text)) == n * 2
        assert [e.name for e in await any_store.load_journal(text)] == ["twice"]
    # A glob character widens nothing: the owner "*" lists its own run only.
    starred = await any_store.list_runs(owner="*")
    assert [r.run_id for r in starred] == [ids["*"]]
    assert [r.run_id for r in await any_store.list_runs(owner="a*")] == [ids["a*"]]
    assert await any_store.delete_run("*") is True
    assert await any_store.get_run("a*") is not None and await any_store.get_run("*") is None


UNSTORABLE = {"lone-surrogate": "bad\ud800", "nul": "a\x00b", "too-long": "k" * 1001}


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
@pytest.mark.parametrize("field", ["run_id", "idempotency_key", "owner"])
async def test_an_unstorable_identifier_is_refused_at_submit_and_stores_nothing(
    any_store: Store, field: str, kind: str
) -> None:
    client = InlineWorkflowRunner(any_store, registry=registry).client
    kwargs: dict[str, Any] = {field: UNSTORABLE[kind]}
    with pytest.raises(InvalidParams, match=field):
        await client.submit("odd.echo", {"n": 1}, **kwargs)
    assert await any_store.list_runs() == []


async def test_an_identifier_of_the_longest_length_allowed_is_stored(any_store: Store) -> None:
    client = InlineWorkflowRunner(any_store, registry=registry).client
    longest = "é" * 1000  # characters, not bytes: 2,000 bytes of UTF-8
    handle = await client.submit(
        "odd.echo", {"n": 1}, run_id=longest, idempotency_key=longest, owner=longest
    )
    assert handle.run_id == longest
    record = await any_store.get_run(longest)
    assert record is not None and record.owner == longest


async def test_hostile_data_never_changes_the_lua_library(valkey_server: ValkeyProcess) -> None:
    client = valkey_server.client()
    store = ValkeyStore(valkey_server.url, namespace=fresh_namespace(), shard_count=4)
    try:
        await store.open()
        before = client.execute_command("FUNCTION", "LIST", "WITHCODE")
        runner = InlineWorkflowRunner(store, registry=registry)
        for n, text in enumerate(ODD):
            handle = await runner.client.submit(
                "odd.echo", {"n": n}, run_id=f"r{n}-{text}", idempotency_key=text, owner=text
            )
            assert await runner.execute(handle) == n * 2
            assert (await handle.record()).status is RunStatus.COMPLETED
        assert client.execute_command("FUNCTION", "LIST", "WITHCODE") == before
    finally:
        await store.close()
        client.close()
