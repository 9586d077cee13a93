"""What a submit stores: task_id is the run id, and the idempotency key only when the
caller chose it (a generated id needs no key: nobody can repeat it); the params are the
arguments and the sender's ``origin`` header."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

from pyrula.workflows import RunRecord, open_store
from pyrula_compat import Celery
from pyrula_compat.store import close_clients


def stored(url: str, run_id: str) -> RunRecord:
    async def read() -> RunRecord:
        store = open_store(url)
        try:
            record = await store.get_run(run_id)
        finally:
            await store.close()
        assert record is not None, run_id
        return record

    return asyncio.run(read())


def test_a_generated_task_id_reserves_no_key_and_a_chosen_one_is_the_key(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'keys.db'}"
    app = Celery("keys", broker=url, set_as_current=False)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    try:
        plain = add.delay(1, 2)
        record = stored(url, plain.id)
        origin = f"gen{os.getpid()}@{socket.gethostname()}"  # the sender: request.origin
        assert record.idempotency_key is None and record.params == (
            f'{{"args":[1,2],"kwargs":{{}},"headers":{{"origin":"{origin}"}}}}'
        )
        # Dicts keep their key order, as kombu's JSON keeps it (the engine's own params
        # are stored sorted): a task gets them as they were sent.
        ordered = add.delay({"b": 1, "a": 2}, y={"z": 0, "c": 1})
        assert stored(url, ordered.id).params.startswith(
            '{"args":[{"b":1,"a":2}],"kwargs":{"y":{"z":0,"c":1}}'
        )

        chosen: Any = add.apply_async((1, 2), task_id="order-42")
        again: Any = add.apply_async((1, 2), task_id="order-42")  # a repeat: the first run
        assert chosen.id == again.id == "order-42"
        assert stored(url, "order-42").idempotency_key == "order-42"
    finally:
        close_clients()


def test_only_an_id_generated_at_the_call_is_marked_fresh(tmp_path: Path, monkeypatch: Any) -> None:
    """A task id made up by ``delay()`` is a fresh uuid4 (``NewRun.generated_id``: an
    ArchivingStore skips its archive lookup); a chosen one, or one frozen in a canvas
    (which may be applied again), is not."""
    from pyrula.workflows.stores.sqlite import SqliteStore

    seen: dict[str, bool] = {}
    original = SqliteStore.create_run

    async def spy(self: SqliteStore, new: Any) -> Any:
        seen[new.run_id] = new.generated_id
        return await original(self, new)

    monkeypatch.setattr(SqliteStore, "create_run", spy)
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    app = Celery("fresh", broker=url, set_as_current=False)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    try:
        plain = add.delay(1, 2)
        chosen = add.apply_async((1, 2), task_id="order-7")
        frozen = add.s(1, 2).freeze()
        add.s(1, 2).apply_async(task_id=frozen.id)
        assert seen[plain.id] is True
        assert seen[chosen.id] is False and seen[frozen.id] is False
    finally:
        close_clients()
