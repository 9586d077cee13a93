"""The shim in one process: eager mode, tasks, retry numbers, config, schedules, alias.

No worker and no server here: eager mode needs neither, and the rest is pure API.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest

from pyrula.workflows import Schedule
from pyrula_compat import Celery, chain, chord, group, shared_task, states
from pyrula_compat.exceptions import ImproperlyConfigured, MaxRetriesExceededError, Retry
from pyrula_compat.execution import backoff_interval
from pyrula_compat.result import EagerResult
from pyrula_compat.schedules import crontab, schedule
from pyrula_compat.store import store_url

HERE = os.path.dirname(os.path.abspath(__file__))


def test_eager_delay_returns_an_eager_result(app: Any) -> None:
    @app.task
    def add(x, y):
        return x + y

    result = add.delay(2, 3)
    assert isinstance(result, EagerResult)
    assert result.get() == 5 and result.state == states.SUCCESS and result.ready()
    assert add.apply((1, 1)).get() == 2  # apply() is always eager
    app.conf.task_always_eager = False
    assert add.apply((1, 2)).get() == 3


def test_eager_failure_is_captured_unless_propagates(app: Any) -> None:
    @app.task
    def boom():
        raise ValueError("bad")

    result = boom.delay()
    assert result.state == states.FAILURE and isinstance(result.result, ValueError)
    assert "raise ValueError" in (result.traceback or "")
    with pytest.raises(ValueError):
        result.get()
    assert isinstance(result.get(propagate=False), ValueError)
    app.conf.task_eager_propagates = True
    with pytest.raises(ValueError, match="bad"):
        boom.delay()
    with pytest.raises(ValueError):
        boom.apply(throw=True)


def test_retries_count_retries_not_attempts(app: Any) -> None:
    calls: list[int] = []

    @app.task(bind=True, autoretry_for=(ConnectionError,), max_retries=3)
    def flaky(self):
        calls.append(self.request.retries)
        raise ConnectionError("down")

    assert isinstance(flaky.delay().result, ConnectionError)
    assert calls == [0, 1, 2, 3]  # max_retries=3: four executions

    @app.task(bind=True, max_retries=1)
    def manual(self):
        raise self.retry(countdown=3600)

    result = manual.delay()
    assert isinstance(result.result, MaxRetriesExceededError)
    assert str(result.result).startswith("Can't retry ") and ".manual[" in str(result.result)


def test_retry_forever_and_per_call_max_retries(app: Any) -> None:
    seen: list[int] = []

    @app.task(bind=True, max_retries=None)
    def forever(self):
        seen.append(self.request.retries)
        if self.request.retries < 20:
            raise self.retry(countdown=1000)
        return "done"

    assert forever.delay().get() == "done" and len(seen) == 21

    @app.task(bind=True, max_retries=10)
    def limited(self):
        raise self.retry(exc=KeyError("k"), max_retries=2)

    assert isinstance(limited.delay().result, KeyError)


def test_retry_defaults_and_direct_call(app: Any) -> None:
    @app.task(bind=True)
    def direct(self):
        try:
            raise OSError("direct")
        except OSError as exc:
            raise self.retry(exc=exc) from exc

    assert direct.default_retry_delay == 180 and direct.max_retries == 3
    with pytest.raises(OSError, match="direct"):
        direct()  # called directly: re-raise, no retry
    task = direct
    task.push_request(called_directly=False, retries=0, id="x")
    try:
        with pytest.raises(Retry) as info:
            task.retry()
        assert info.value.when == 180
    finally:
        task.pop_request()


def test_retry_with_throw_false_and_new_args(app: Any) -> None:
    seen: list[Any] = []

    @app.task(bind=True, max_retries=2)
    def again(self, n):
        seen.append(n)
        if n < 2:
            raise self.retry(args=(n + 1,), countdown=0)
        return n

    assert again.delay(0).get() == 2 and seen == [0, 1, 2]

    @app.task(bind=True)
    def soft(self):
        self.retry(countdown=5, throw=False)  # eager: no retry, the value stands
        return "kept"

    assert soft.delay().get() == "kept"


def test_hooks_and_signals_fire_in_celerys_order(app: Any) -> None:
    from pyrula_compat import signals

    order: list[str] = []

    class Hooked(app.Task):  # type: ignore[name-defined,misc]
        def before_start(self, task_id, args, kwargs):
            order.append("before_start")

        def on_success(self, retval, task_id, args, kwargs):
            order.append("on_success")

        def after_return(self, status, retval, task_id, args, kwargs, einfo):
            order.append(f"after_return {status}")

    @app.task(base=Hooked)
    def body():
        order.append("body")
        return 1

    def prerun(sender: Any, **kwargs: Any) -> None:
        order.append("task_prerun")

    def postrun(sender: Any, state: str, **kwargs: Any) -> None:
        order.append(f"task_postrun {state}")

    def success(sender: Any, result: Any, **kwargs: Any) -> None:
        order.append("task_success")

    signals.task_prerun.connect(prerun, sender=body)
    signals.task_postrun.connect(postrun, sender=body)
    signals.task_success.connect(success, sender=body)
    body.delay()
    assert order == [
        "task_prerun", "before_start", "body", "on_success", "task_success",
        "after_return SUCCESS", "task_postrun SUCCESS",
    ]  # fmt: skip


def test_backoff_numbers_match_celery() -> None:
    assert [backoff_interval(1, r, 600, False) for r in range(11)] == [
        1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600,
    ]  # fmt: skip
    assert backoff_interval(3, 2, 600, False) == 12
    random.seed(7)
    values = {backoff_interval(1, 3, 600, True) for _ in range(300)}
    assert values == set(range(0, 9))  # full jitter: a uniform int in [0, 8]


def test_autoretry_backoff_applies_only_to_autoretry(app: Any) -> None:
    countdowns: list[Any] = []
    real_retry = app.Task.retry

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        countdowns.append(kwargs.get("countdown"))
        return real_retry(self, *args, **kwargs)

    @app.task(bind=True, autoretry_for=(ValueError,), retry_backoff=2, retry_jitter=False,
              max_retries=3)  # fmt: skip
    def backing(self):
        raise ValueError("x")

    with mock.patch.object(type(backing), "retry", spy):
        backing.delay()
    assert countdowns == [2, 4, 8, 16]


def test_decorator_options_read_back_and_run_is_the_body(app: Any) -> None:
    @app.task(queue="emails", rate_limit="10/m", delivery_mode=2, acks_late=True,
              ignore_result=True, soft_time_limit=5)  # fmt: skip
    def send(to):
        return f"sent {to}"

    assert (send.queue, send.rate_limit, send.delivery_mode, send.acks_late) == (
        "emails", "10/m", 2, True,
    )  # fmt: skip
    assert send.name == "test_api.send" or send.name.endswith(".send")
    assert send.run("a") == "sent a" and send("b") == "sent b"
    with mock.patch.object(send, "run", return_value="patched"):
        assert send("c") == "patched"


def test_mock_patch_delay_and_attribute_assignment(app: Any) -> None:
    import proj.tasks as t

    with mock.patch("proj.tasks.add.delay") as fake:
        t.add.delay(1, 2)
        fake.assert_called_once_with(1, 2)
    original = t.add.apply_async
    t.add.apply_async = lambda *a, **k: "replaced"  # type: ignore[method-assign]
    try:
        assert t.add.delay(1, 2) == "replaced"  # delay goes through apply_async
    finally:
        del t.add.apply_async
    assert t.add.apply_async == original


def test_signature_mismatch_raises_type_error_at_the_call(app: Any) -> None:
    @app.task
    def two(x, y):
        return x

    with pytest.raises(TypeError):
        two.delay(1)
    with pytest.raises(TypeError):
        two.apply_async((1, 2, 3))

    @app.task(typing=False)
    def loose(x):
        return x

    assert loose.typing is False


def test_eager_canvas(app: Any) -> None:
    @app.task
    def add(x, y):
        return x + y

    @app.task
    def total(xs):
        return sum(xs)

    assert chain(add.s(1, 2), add.s(3))().get() == 6
    assert group(add.s(4), add.s(5))(6).get() == [10, 11]
    assert chord([add.s(1, 1), add.s(2, 2)], total.s())().get() == 6
    assert (group(add.s(1, 1), add.s(2, 2)) | total.s())().get() == 6
    assert add.s(4).delay(6).get() == 10


def test_shared_task_and_current_app_without_any_app() -> None:
    code = (
        "from pyrula_compat import shared_task, current_app\n"
        "@shared_task\n"
        "def hello(n): return n * 2\n"
        "current_app.conf.task_always_eager = True\n"
        "assert hello.delay(21).get() == 42\n"
        "assert current_app.main == 'default'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_runtime_eager_flip_takes_effect_on_the_next_call() -> None:
    import proj.tasks as t

    app = t.add.app
    previous = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        assert isinstance(t.add.delay(1, 1), EagerResult)
    finally:
        app.conf.task_always_eager = previous


def test_shared_task_belongs_to_every_app() -> None:
    @shared_task(name="compat.shared_probe")
    def probe():
        return "p"

    other = Celery("other", broker="memory://", set_as_current=False)
    assert other.tasks["compat.shared_probe"] is probe


# -- configuration ---------------------------------------------------------------------
def test_config_namespace_and_old_names() -> None:
    app = Celery("cfg", set_as_current=False)
    app.config_from_object(
        {"CELERY_TASK_ALWAYS_EAGER": True, "CELERY_BROKER_URL": "memory://", "OTHER": 1},
        namespace="CELERY",
    )
    assert app.conf.task_always_eager is True and app.conf["broker_url"] == "memory://"
    assert app.conf.get("OTHER") == 1  # any name of the source reads, as in Celery 5.7
    old = Celery("old", set_as_current=False)
    old.config_from_object({"CELERY_ALWAYS_EAGER": True, "BROKER_URL": "memory://",
                            "CELERY_TASK_RESULT_EXPIRES": 60,
                            "CELERYD_MAX_TASKS_PER_CHILD": 100,
                            "CELERYD_MAX_MEMORY_PER_CHILD": 200_000})  # fmt: skip
    assert old.conf.task_always_eager is True and old.conf.result_expires == 60
    assert old.conf.worker_max_tasks_per_child == 100
    assert old.conf.worker_max_memory_per_child == 200_000
    assert old.conf.broker_url == "memory://" and old.conf.BROKER_URL == "memory://"
    old.conf.update(timezone="Europe/Paris")
    assert old.conf["timezone"] == "Europe/Paris" and old.timezone_name() == "Europe/Paris"


def test_environment_overrides_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("env", broker="sqlite:///a.db", set_as_current=False)
    monkeypatch.setenv("CELERY_BROKER_URL", "memory://")
    assert app.conf.broker_url == "memory://" and app.store_url() == "memory://"


@pytest.mark.parametrize(
    ("broker", "backend", "expected"),
    [
        (None, None, None),
        ("redis://h:6379/0", "redis://h:6379/1", "redis://h:6379/0"),
        ("sqla+sqlite:///x.db", None, "sqlite:///x.db"),
        ("db+sqlite:///x.db", "db+sqlite:///x.db", "sqlite:///x.db"),
        (None, "redis://h:6379/1", "redis://h:6379/1"),
        ("valkey://h", "rpc://", "valkey://h"),
        ("memory://", "django-db", "memory://"),
    ],
)
def test_store_url_from_broker_and_backend(broker: Any, backend: Any, expected: Any) -> None:
    assert store_url(broker, backend) == expected


def test_bad_brokers_and_backends_are_clear_errors() -> None:
    with pytest.raises(ImproperlyConfigured, match="needs no separate message broker"):
        store_url("amqp://guest@localhost//", None)
    with pytest.raises(ImproperlyConfigured, match="different server"):
        store_url("redis://a:6379/0", "redis://b:6379/0")
    with pytest.raises(ImproperlyConfigured, match="not a store"):
        store_url("redis://a:6379/0", "db+postgresql://db/results")


def test_pickle_serializer_is_refused() -> None:
    app = Celery("pickly", broker="memory://", set_as_current=False)
    app.conf.task_serializer = "pickle"
    with pytest.raises(ImproperlyConfigured, match="JSON only"):
        app.check_serializers()
    app.conf.task_serializer = "json"
    app.conf.accept_content = ["json", "yaml"]
    with pytest.raises(ImproperlyConfigured, match="yaml"):
        app.client()


# -- schedules -------------------------------------------------------------------------
def test_crontab_fields_and_errors() -> None:
    assert crontab().cron_expression() == "* * * * *"
    assert crontab(minute="*/15").cron_expression() == "0,15,30,45 * * * *"
    assert crontab(hour="9-17", day_of_week="mon-fri").cron_expression() == (
        "* 9,10,11,12,13,14,15,16,17 * * 1,2,3,4,5"
    )
    assert crontab(day_of_week="sun,sat").day_of_week == {0, 6}
    assert crontab(day_of_week=0).day_of_week == {0}  # 0 is Sunday
    assert crontab(hour="22-2").hour == {22, 23, 0, 1, 2}
    with pytest.raises(ValueError, match="Invalid end range: 7 > 6"):
        crontab(day_of_week=7)
    with pytest.raises(ValueError):
        crontab(minute=61)


def test_crontab_day_of_week_and_day_of_month_are_anded() -> None:
    first_monday = crontab(minute=0, hour=0, day_of_week="mon", day_of_month="1-7")
    assert first_monday.day_and
    start = datetime(2024, 1, 1, 0, 30, tzinfo=UTC)  # a Monday, just past 00:00
    slots = []
    moment = start
    for _ in range(3):
        moment = first_monday.next_after(moment)
        slots.append(moment.date().isoformat())
    assert slots == ["2024-02-05", "2024-03-04", "2024-04-01"]


def test_crontab_reads_the_app_timezone_and_keeps_dst_rules() -> None:
    nine = crontab(minute=0, hour=9)
    paris = nine.schedule_for("t", {}, "t", "Europe/Paris")
    after = datetime(2024, 7, 1, 12, tzinfo=UTC).timestamp()
    slot = datetime.fromtimestamp(paris.next_slot_after(after), UTC)
    assert slot == datetime(2024, 7, 2, 7, 0, tzinfo=UTC)  # 09:00 CEST
    # 02:30 happens twice when clocks go back (2024-10-27): it fires once.
    half_two = crontab(minute=30, hour=2).schedule_for("t", {}, "t", "Europe/Paris")
    start = datetime(2024, 10, 26, 23, 0, tzinfo=UTC).timestamp()
    first = half_two.next_slot_after(start)
    second = half_two.next_slot_after(first)
    assert second - first > 20 * 3600


def test_beat_entries_become_schedules_with_fixed_ids() -> None:
    from pyrula_compat.beat import schedules_of

    app = Celery("beaty", broker="memory://", set_as_current=False)
    app.conf.timezone = "America/New_York"
    app.conf.beat_schedule = {
        "every-2s": {"task": "beaty.tick", "schedule": 2.0, "args": (1,)},
        "every-minute": {"task": "beaty.tick", "schedule": timedelta(minutes=1)},
        "interval": {"task": "beaty.tick", "schedule": schedule(timedelta(seconds=30))},
        "digest": {"task": "beaty.digest", "schedule": crontab(minute=0, hour=7),
                   "kwargs": {"kind": "daily"}, "options": {"expires": 60, "queue": "q"}},
    }  # fmt: skip
    found = {s.schedule_id: s for s in schedules_of(app)}
    assert set(found) == {"every-2s", "every-minute", "interval", "digest"}
    assert found["every-2s"].every == 2.0 and found["every-2s"].params["args"] == [1]
    digest: Schedule = found["digest"]
    assert digest.cron == "0 7 * * *" and digest.timezone == "America/New_York"
    assert digest.params == {
        "args": [],
        "kwargs": {"kind": "daily"},
        "expires_in": 60.0,
        "headers": {"periodic_task_name": "digest", "pyrula_beat_app": "beaty"},
    }


# -- the celery import alias -------------------------------------------------------------
def test_celery_alias_is_opt_in() -> None:
    code = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('celery') is None\n"
        "from pyrula_compat import alias\n"
        "assert alias.install()\n"
        "from celery import Celery, shared_task\n"
        "from celery.schedules import crontab\n"
        "import celery.app.task, pyrula_compat.app.task\n"
        "assert celery.app.task is pyrula_compat.app.task\n"
        "assert Celery.__module__ == 'pyrula_compat.app.base'\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    plain = subprocess.run(
        [sys.executable, "-c", "import pyrula_compat, celery"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert plain.returncode != 0 and "No module named 'celery'" in plain.stderr
