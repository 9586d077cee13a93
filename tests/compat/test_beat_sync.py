"""Syncing beat_schedule to stored schedules at worker start: written, left alone when
unchanged, deleted when the entry goes, and nothing that another app or `pyrula
schedules` made is touched."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from pathlib import Path

import pytest

from pyrula.workflows import Schedule, SqliteStore
from pyrula_compat import Celery
from pyrula_compat.beat import sync_schedules


def beat_app(main: str, entries: dict[str, float]) -> Celery:
    app = Celery(main, broker="memory://", set_as_current=False)
    app.conf.beat_schedule = {
        key: {"task": f"{main}.tick", "schedule": timedelta(seconds=seconds), "args": (key,)}
        for key, seconds in entries.items()
    }
    return app


def test_a_removed_entry_deletes_only_its_own_schedule(tmp_path: Path) -> None:
    async def main() -> None:
        store = SqliteStore(tmp_path / "beat.db")
        try:
            written = await sync_schedules(beat_app("proj", {"a": 5, "b": 7}), store)
            assert sorted(written) == ["a", "b"]
            await sync_schedules(beat_app("other", {"c": 3}), store)
            mine = Schedule.create("proj.tick", params={"args": ["d"]}, schedule_id="d", every=11)
            await store.create_schedule(mine.to_record(await store.now()))
            first_a = await store.get_schedule("a")

            # "b" left proj's beat_schedule: its schedule goes; "a" is left as it was.
            assert await sync_schedules(beat_app("proj", {"a": 5}), store) == []
            ids = sorted(record.schedule_id for record in await store.list_schedules())
            assert ids == ["a", "c", "d"]
            assert await store.get_schedule("a") == first_a
            assert first_a is not None
            assert json.loads(first_a.params)["headers"]["periodic_task_name"] == "a"
        finally:
            await store.close()

    asyncio.run(main())


def test_only_a_scheduler_other_than_celerys_default_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        store = SqliteStore(tmp_path / "beat.db")
        try:
            with caplog.at_level(logging.WARNING, logger="pyrula_compat.beat"):
                app = beat_app("proj", {"a": 5})
                assert app.conf.beat_scheduler == "celery.beat:PersistentScheduler"
                await sync_schedules(app, store)
                assert "beat_scheduler" not in caplog.text  # Celery's default: nothing to say
                app.conf.beat_scheduler = "django_celery_beat.schedulers:DatabaseScheduler"
                await sync_schedules(app, store)
                assert "beat_scheduler='django_celery_beat" in caplog.text
        finally:
            await store.close()

    asyncio.run(main())


def test_beat_entries_fire_every_slot_and_a_changed_policy_is_put_back(tmp_path: Path) -> None:
    """beat_schedule entries keep Celery beat's behaviour, overlap "allow_all"; a stored
    entry whose policy was changed by hand is rewritten from beat_schedule, like its
    timing would be."""

    async def main() -> None:
        store = SqliteStore(tmp_path / "beat.db")
        try:
            assert await sync_schedules(beat_app("proj", {"a": 5}), store) == ["a"]
            stored = await store.get_schedule("a")
            assert stored is not None and stored.overlap == "allow_all"
            skip = Schedule.create(
                "proj.tick", every=5, schedule_id="a", params=json.loads(stored.params),
                overlap="skip",
            )  # fmt: skip
            await store.create_schedule(skip.to_record(await store.now()), replace=True)
            assert await sync_schedules(beat_app("proj", {"a": 5}), store) == ["a"]
            assert (await store.get_schedule("a")).overlap == "allow_all"  # type: ignore[union-attr]
            assert await sync_schedules(beat_app("proj", {"a": 5}), store) == []  # unchanged
        finally:
            await store.close()

    asyncio.run(main())
