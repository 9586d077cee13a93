"""``pyrula migrate celery`` against real Celery 5.7 on a real valkey-server.

Real Celery (in processes of their own, with Celery on their path) publishes into the
broker with no Celery worker running: plain tasks, a countdown and an eta, priorities, a
routed queue, a chain, a task in the middle of its retries, a pickle-serialized message
and a task the app does not know. The adoption takes what it can, leaves the rest in
place with the reason, and ``pyrula worker -A`` then runs each adopted task once, with its
arguments, not before its time. Then: adoptions run concurrently with a real ``celery
worker`` on the same broker (every message runs once in all), and an adoption SIGKILLed
midway and run again (nothing lost, nothing twice).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.compat.conftest import pyrula_command, wait_until
from tests.compat.migrating.move import APP, Move

pytestmark = pytest.mark.slow


@pytest.fixture
def move(tmp_path: Path, valkey_server: Any) -> Iterator[Move]:
    moving = Move(tmp_path, valkey_server.url)
    try:
        yield moving
    finally:
        moving.close()


PUBLISH_MIXED = """
for i in range(5):
    add.apply_async((i, i), task_id=f"plain-{i}")
record.apply_async(("countdown",), countdown=3, task_id="countdown")
record.apply_async(("eta",), eta=datetime.now(UTC) + timedelta(seconds=3), task_id="eta")
record.apply_async(("p9",), {"n": 9}, priority=9, task_id="p9")
record.apply_async(("p3",), priority=3, task_id="p3")
routed.apply_async(("routed",), task_id="routed")
(add.s(1, 1).set(task_id="chain-1") | add.s(2).set(task_id="chain-2")
 | add.s(3).set(task_id="chain-3")).apply_async()
app.send_task("migrating.flaky", ("mid-retry",), retries=1, countdown=0.5, task_id="retried")
record.apply_async(("pickled",), serializer="pickle", task_id="pickled")
app.send_task("migrating.nope", (1,), task_id="unknown")
"""


def test_a_broker_at_rest_is_adopted_and_each_task_runs_once(move: Move) -> None:
    move.publish(PUBLISH_MIXED)
    before = move.depth()

    dry = move.migrate("--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would adopt: 12" in dry.stdout, dry.stdout
    assert move.depth() == before  # a dry run takes nothing

    adopted_at = time.time()
    first = move.migrate()
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "adopted: 12" in out, out
    assert "queue routed" in out and "priority 9" in out and "priority 3" in out
    assert "unknown migrating.nope: the app has no task named 'migrating.nope'" in out
    assert "pickle-serialized, never unpickled: migrating.record (1)" in out
    assert move.depth() == 2  # the pickled and the unknown message stay, for Celery

    again = move.migrate()
    assert again.returncode == 0, again.stderr
    assert "adopted: 0" in again.stdout and "left in the broker: 2" in again.stdout
    assert move.depth() == 2

    worker = move.pyrula_worker()
    wanted = {f"plain-{i}" for i in range(5)} | {
        "countdown", "eta", "p9", "p3", "routed", "chain-1", "chain-2", "chain-3", "retried",
    }  # fmt: skip
    wait_until(lambda: wanted <= {r["id"] for r in move.ran()}, 60, "the adopted tasks ran")
    time.sleep(1.0)  # anything that would run twice has had the time to
    move.stop(worker)
    ran = move.ran()
    counts = Counter(r["id"] for r in ran if r["task"] != "flaky")
    assert all(counts[i] == 1 for i in wanted - {"retried"}), counts
    assert {r["side"] for r in ran} == {"pyrula"}
    by_id = {r["id"]: r for r in ran}
    assert [by_id[f"plain-{i}"]["value"] for i in range(5)] == [0, 2, 4, 6, 8]
    assert [by_id[f"chain-{i}"]["value"] for i in (1, 2, 3)] == [2, 4, 7]
    assert by_id["p9"]["value"] == {"tag": "p9", "n": 9}
    # The countdown and the eta kept their time: not run before it.
    assert by_id["countdown"]["at"] >= adopted_at - 1 + 3 - 1.0
    assert by_id["eta"]["at"] >= adopted_at - 1 + 3 - 1.0
    # The retried task carried its retries over: attempt 1 retried, attempt 2 succeeded.
    assert [r["retries"] for r in ran if r["task"] == "flaky"] == [1, 2]


def test_adoptions_beside_a_live_celery_worker_run_every_message_once(move: Move) -> None:
    move.publish("for i in range(600):\n    record.apply_async((str(i),), task_id=f'live-{i}')")
    celery_worker = move.celery_worker()
    adopters = [
        move.start(
            [*pyrula_command(), "migrate", "celery", "-A", APP, "--from", move.old],
            "pyrula",
            f"migrate-{n}",
        )
        for n in range(2)
    ]
    for adopter in adopters:
        assert adopter.wait(120) == 0
    pyrula_worker = move.pyrula_worker()
    wanted = {f"live-{i}" for i in range(600)}
    wait_until(lambda: wanted <= {r["id"] for r in move.ran()}, 90, "every message ran")
    time.sleep(1.0)
    move.stop(pyrula_worker)
    move.stop(celery_worker)
    counts = Counter(r["id"] for r in move.ran())
    assert set(counts) == wanted and set(counts.values()) == {1}, counts.most_common(3)
    assert move.depth() == 0
    sides = Counter(r["side"] for r in move.ran())
    print(f"ran on each side: {dict(sides)}")
    assert sides["celery"] > 0 and sides["pyrula"] > 0, sides  # both sides consumed


def test_an_adoption_killed_midway_loses_nothing_when_run_again(move: Move) -> None:
    move.publish("for i in range(400):\n    record.apply_async((str(i),), task_id=f'kill-{i}')")
    adopter = move.start(
        [*pyrula_command(), "migrate", "celery", "-A", APP, "--from", move.old], "pyrula",
        "migrate-killed",
    )  # fmt: skip
    wait_until(lambda: move.depth() < 350 or adopter.poll() is not None, 60, "adoption under way")
    os.kill(adopter.pid, signal.SIGKILL)
    adopter.wait(10)
    assert move.depth() > 0, "the adoption ended before it was killed"
    rerun = move.migrate()
    assert rerun.returncode == 0, rerun.stderr
    assert move.depth() == 0
    assert move.redis.llen(move.prefix + "pyrula.adopting") == 0
    worker = move.pyrula_worker()
    wanted = {f"kill-{i}" for i in range(400)}
    wait_until(lambda: wanted <= {r["id"] for r in move.ran()}, 90, "every message ran")
    time.sleep(1.0)
    move.stop(worker)
    counts = Counter(r["id"] for r in move.ran())
    assert set(counts) == wanted and set(counts.values()) == {1}


def test_a_broker_that_is_not_redis_is_refused_with_what_can_be_adopted(move: Move) -> None:
    done = subprocess.run(
        [*pyrula_command(), "migrate", "celery", "-A", APP, "--from", "amqp://guest@localhost//"],
        env=move.env("pyrula"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "only a Celery broker on Redis or Valkey can be adopted" in done.stderr


def test_a_message_taken_but_not_stored_is_adopted_by_the_next_run(move: Move) -> None:
    from pyrula_compat.migrate.broker import CeleryBroker, Held

    move.publish("record.apply_async(('taken',), task_id='taken')")
    broker = CeleryBroker(move.old, key_prefix=move.prefix)
    try:
        key = move.prefix + "celery"
        (raw,) = broker.oldest(key, 0, 10)
        held = Held(raw=raw, source=key, queue="celery")
        assert broker.take(held)  # a run killed right here: taken, its run not stored
        assert broker.take(held) is False  # taken once only
        assert move.depth() == 0 and broker.adopting() == [held]
    finally:
        broker.close()
    done = move.migrate()
    assert done.returncode == 0, done.stderr
    assert "adopted: 1" in done.stdout, done.stdout
    assert move.redis.llen(move.prefix + "pyrula.adopting") == 0
    worker = move.pyrula_worker()
    wait_until(lambda: {r["id"] for r in move.ran()} == {"taken"}, 60, "the task ran")
    move.stop(worker)
    assert [r["id"] for r in move.ran()] == ["taken"]


def test_reserved_messages_are_adopted_only_when_asked_once_their_timeout_passed(
    move: Move,
) -> None:
    # A Celery worker reserves a countdown task (it waits in the worker for its eta) and
    # is SIGKILLed: the message is left in the broker's unacked hash.
    move.publish("record.apply_async(('reserved',), countdown=6, task_id='reserved')")
    celery_worker = move.celery_worker()
    wait_until(lambda: move.redis.hlen(move.prefix + "unacked") == 1, 30, "the task reserved")
    os.kill(celery_worker.pid, signal.SIGKILL)
    celery_worker.wait(10)
    assert move.depth() == 0

    kept = move.migrate()
    assert kept.returncode == 0, kept.stderr
    assert "adopted: 0" in kept.stdout and "left to Celery workers" in kept.stdout
    young = move.migrate("--include-unacked")  # reserved for less than an hour: still its
    assert "adopted: 0" in young.stdout and "left to Celery workers" in young.stdout

    taken = move.migrate("--include-unacked", "--visibility-timeout", "0")
    assert taken.returncode == 0, taken.stderr
    assert "adopted: 1" in taken.stdout, taken.stdout
    assert move.redis.hlen(move.prefix + "unacked") == 0
    worker = move.pyrula_worker()
    wait_until(lambda: {r["id"] for r in move.ran()} == {"reserved"}, 60, "the task ran")
    move.stop(worker)
    (ran,) = move.ran()
    assert ran["side"] == "pyrula" and ran["value"] == {"tag": "reserved"}


def test_results_of_the_old_backend_are_read_for_ids_pyrula_has_no_run_for(
    move: Move, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyrula_compat import Celery, states
    from pyrula_compat.result import AsyncResult

    monkeypatch.setenv("MIGRATE_RESULTS", "1")
    move.publish(
        "add.apply_async((2, 3), task_id='old-ok')\n"
        "boom.apply_async(('x',), task_id='old-failed')\n"
        "record.apply_async(('later',), countdown=3600, task_id='old-waiting')\n"
    )
    celery_worker = move.celery_worker()
    wait_until(lambda: {r["id"] for r in move.ran()} == {"old-ok", "old-failed"}, 60, "ran")
    wait_until(lambda: move.redis.exists(move.prefix + "celery-task-meta-old-failed"), 30,
               "the failure stored")  # fmt: skip
    move.stop(celery_worker)

    app = Celery("new", broker=move.store)
    app.conf.result_backend_fallback = move.old
    app.conf.result_backend_fallback_prefix = move.prefix
    ok = AsyncResult("old-ok", app=app)
    assert ok.state == states.SUCCESS and ok.get(timeout=5) == 5
    failed = AsyncResult("old-failed", app=app)
    assert failed.state == states.FAILURE
    with pytest.raises(ValueError, match="bad x"):
        failed.get(timeout=5)
    assert "ValueError" in (failed.traceback or "")
    assert AsyncResult("old-waiting", app=app).state == states.PENDING  # not ended there
    assert AsyncResult("never-sent", app=app).state == states.PENDING
    no_fallback = Celery("plain", broker=move.store)
    assert AsyncResult("old-ok", app=no_fallback).state == states.PENDING
