"""What a submit stores: task_id is the run id, and the idempotency key only when the
caller chose it (a generated id needs no key: nobody can repeat it)."""

from __future__ import annotations

import asyncio
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
        assert record.idempotency_key is None and record.params == '{"args":[1,2],"kwargs":{}}'

        chosen: Any = add.apply_async((1, 2), task_id="order-42")
        again: Any = add.apply_async((1, 2), task_id="order-42")  # a repeat: the first run
        assert chosen.id == again.id == "order-42"
        assert stored(url, "order-42").idempotency_key == "order-42"
    finally:
        close_clients()
