"""Settings without a worker: each app its own mutable defaults (a periodic task added
to one app is not in another's ``beat_schedule``), old setting names read under a
namespace too, as in Celery (docs/django.md); every Celery setting reads its
default; mixing old and new names, or a source that does not import, raises as in
Celery; ``on_after_configure`` is sent as the configuration loads, in any process; and
``enable_utc=False`` reads the machine's time zone."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pyrula_compat import Celery
from pyrula_compat.app import localtz
from pyrula_compat.app.defaults import DEFAULTS
from pyrula_compat.beat import schedules_of
from pyrula_compat.config import ConfigurationNotFound
from pyrula_compat.exceptions import CeleryError, ImproperlyConfigured
from pyrula_compat.worker import AppWorker


def test_beat_entries_of_one_app_stay_in_that_app() -> None:
    a = Celery("a", broker="memory://", set_as_current=False)
    b = Celery("b", broker="memory://", set_as_current=False)

    @a.task(name="audit.ping")
    def ping() -> int:
        return 1

    a.add_periodic_task(10.0, ping.s(), name="ping every 10")
    assert list(a.conf.beat_schedule) == ["ping every 10"]
    assert b.conf.beat_schedule == {} and schedules_of(b) == []
    a.conf.broker_transport_options["x"] = 1  # other mutable defaults are per app too
    assert b.conf.broker_transport_options == {}

    c = Celery("c", broker="memory://", set_as_current=False)  # the Celery docs' pattern

    @c.on_after_configure.connect
    def setup(sender: Celery, **kwargs: object) -> None:
        sender.add_periodic_task(5.0, ping.s(), name="five")

    AppWorker(c).prepare()
    assert list(c.conf.beat_schedule) == ["five"]
    assert list(a.conf.beat_schedule) == ["ping every 10"] and b.conf.beat_schedule == {}
    assert Celery("d", broker="memory://", set_as_current=False).conf.beat_schedule == {}


def test_old_names_are_read_under_a_namespace_as_celery(monkeypatch: pytest.MonkeyPatch) -> None:
    # What Celery 5.7 gives for these settings under namespace="CELERY": its lookup tries
    # CELERY_<NAME>, then the name, then the old name.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    settings = {
        "BROKER_URL": "memory://",
        "CELERY_ALWAYS_EAGER": True,
        "CELERYBEAT_SCHEDULE": {"x": {"task": "t", "schedule": 5.0}},
        "CELERY_TASK_RESULT_EXPIRES": 60,
        "CELERY_TASK_SERIALIZER": "json",
        "CELERY_TIMEZONE": "Europe/Paris",  # an old name that is also prefix + new name
    }
    app = Celery("ns", set_as_current=False)
    app.config_from_object(settings, namespace="CELERY")
    assert app.conf.broker_url == "memory://" and app.conf.task_always_eager is True
    assert list(app.conf.beat_schedule) == ["x"] and app.conf.result_expires == 60
    assert app.conf.timezone == "Europe/Paris" and app.conf.task_serializer == "json"
    settings["CELERY_TASK_ALWAYS_EAGER"] = False  # the namespaced name comes first
    assert app.conf.task_always_eager is False

    plain = Celery("plain", set_as_current=False)  # and without a namespace
    plain.config_from_object(settings)
    assert plain.conf.broker_url == "memory://" and plain.conf.task_always_eager is True
    assert list(plain.conf.beat_schedule) == ["x"] and plain.conf.result_expires == 60


def make(**settings: object) -> Celery:
    return Celery("cfg", broker="memory://", set_as_current=False, **settings)


def test_every_celery_setting_reads_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    conf = Celery("cfg", set_as_current=False).conf
    assert len(DEFAULTS) == 207  # Celery 5.7's celery/app/defaults.py
    assert [key for key, value in DEFAULTS.items() if conf[key] != value] == []
    assert conf.worker_max_tasks_per_child is None and conf.task_default_priority is None
    assert conf.beat_max_loop_interval == 0 and conf.task_acks_on_failure_or_timeout is True
    assert conf.worker_send_task_events is False and conf.control_queue_ttl == 300.0
    assert conf.result_expires == timedelta(days=1) and conf.accept_content == ("json",)
    assert conf.beat_scheduler == "celery.beat:PersistentScheduler"
    assert conf.task_default_exchange == conf.task_default_routing_key == "celery"
    assert conf.worker_log_format.startswith("[%(asctime)s: %(levelname)s/%(processName)s]")
    with pytest.raises(AttributeError, match="no setting 'no_such_setting'"):
        conf.no_such_setting  # noqa: B018
    # pyrula's readers take Celery's types: a day of run retention, no scheduler warning
    assert AppWorker(make()).retention() == 86400.0


def test_old_names_and_add_defaults() -> None:
    app = make()
    app.config_from_object({"CELERYD_MAX_TASKS_PER_CHILD": 9, "CELERY_SEND_EVENTS": True})
    assert app.conf.worker_max_tasks_per_child == 9 and app.conf.worker_send_task_events
    assert app.conf["CELERYBEAT_MAX_LOOP_INTERVAL"] == 0  # an old name reads the new one
    later = make()
    later.config_from_object({"task_default_queue": "from-source"})
    later.add_defaults({"task_default_queue": "q", "task_default_priority": 5})
    assert later.conf.task_default_queue == "from-source"  # a source wins over them
    assert later.conf.task_default_priority == 5  # they win over Celery's defaults


def test_mixing_old_and_new_names_raises_as_celery() -> None:
    app = make()
    app.config_from_object(
        {"CELERY_ALWAYS_EAGER": True, "BROKER_URL": "memory://", "task_default_queue": "x",
         "result_backend": "y"}
    )  # fmt: skip
    with pytest.raises(ImproperlyConfigured) as raised:
        app.conf.task_always_eager  # noqa: B018
    message = str(raised.value)
    assert "Cannot mix new and old setting keys" in message
    assert f"{'BROKER_URL':<36} -> broker_url" in message
    assert f"{'CELERY_ALWAYS_EAGER':<36} -> task_always_eager" in message
    with pytest.raises(ImproperlyConfigured):  # still, on the next read
        app.conf.task_default_queue  # noqa: B018
    mostly_old = make()
    mostly_old.config_from_object(
        {"CELERY_ALWAYS_EAGER": True, "BROKER_URL": "memory://", "task_default_queue": "x"}
    )
    with pytest.raises(ImproperlyConfigured, match="rename the following settings to use the old"):
        mostly_old.conf.task_always_eager  # noqa: B018
    both = make()  # one setting under both of its names is no mix
    both.config_from_object({"CELERY_TASK_RESULT_EXPIRES": 5, "result_expires": 5})
    assert both.conf.result_expires == 5
    django = make()  # under a namespace, CELERY_TASK_ALWAYS_EAGER is the new style
    django.config_from_object(
        {"CELERY_TASK_ALWAYS_EAGER": True, "CELERY_BROKER_URL": "memory://",
         "CELERY_TIMEZONE": "Europe/Paris", "TIME_ZONE": "UTC", "DEBUG": True},
        namespace="CELERY",
    )  # fmt: skip
    assert django.conf.task_always_eager is True and django.conf.timezone == "Europe/Paris"


def test_a_source_that_does_not_import_raises_its_import_error_when_read() -> None:
    assert issubclass(ImproperlyConfigured, CeleryError)
    app = make()
    app.config_from_object("no_such_settings_module_zz")  # lazy: nothing raised yet
    for _ in range(2):  # at the first read, and at the next ones
        with pytest.raises(ModuleNotFoundError, match="no_such_settings_module_zz"):
            app.conf.task_default_queue  # noqa: B018
    missing_attr = make()
    missing_attr.config_from_object("os:no_such_attribute")
    with pytest.raises(ModuleNotFoundError, match="no_such_attribute"):
        missing_attr.conf.task_default_queue  # noqa: B018
    silent = make()
    silent.config_from_object("no_such_settings_module_zz", silent=True)
    assert silent.conf.task_default_queue == "celery"
    with pytest.raises(ConfigurationNotFound) as raised:  # force: at once
        make().config_from_object("no_such_settings_module_zz", force=True)
    assert isinstance(raised.value, ImportError) and isinstance(raised.value, ImproperlyConfigured)
    assert "cannot load configuration 'no_such_settings_module_zz'" in str(raised.value)


def test_on_after_configure_is_sent_when_the_configuration_loads() -> None:
    app = make()
    sent: list[str] = []

    @app.task(name="cfg.test")
    def test(arg: str) -> str:
        return arg

    app.add_periodic_task(60.0, test.s("early"))  # before: added as the config loads
    app.on_configure.connect(lambda sender, **kw: sent.append("on_configure"), weak=False)

    @app.on_after_configure.connect
    def setup_periodic_tasks(sender: Celery, **kwargs: object) -> None:
        sent.append("on_after_configure")
        sender.add_periodic_task(10.0, test.s("hello"), name="add every 10")
        sender.add_periodic_task(30.0, test.s("world"), expires=10)

    app.on_after_finalize.connect(lambda sender, **kw: sent.append("finalize"), weak=False)
    assert sent == [] and not app.configured  # defining tasks reads no setting
    assert app.conf.task_default_queue == "celery"  # a client process: the first read
    assert sent == ["on_configure", "on_after_configure"]
    schedule = app.conf.beat_schedule
    assert list(schedule) == ["cfg.test('early')", "add every 10", "cfg.test('world')"]
    assert schedule["cfg.test('world')"] == {
        "schedule": 30.0, "task": "cfg.test", "args": ("world",), "kwargs": {},
        "options": {"expires": 10},
    }  # fmt: skip
    app.finalize()
    AppWorker(app).prepare()  # the worker sends it too: not a second time
    assert sent == ["on_configure", "on_after_configure", "finalize"]
    assert app.on_after_configure.send(sender=app) == []


def test_task_attributes_left_none_read_the_settings() -> None:
    app = Celery("fromconf", broker="memory://", set_as_current=False, strict_typing=False)
    app.conf.update(task_acks_late=True, task_ignore_result=True, task_track_started=True)

    @app.task
    def plain():
        return 1

    @app.task(acks_late=False, serializer=None, typing=True)  # an option (None: the setting)
    def opted():
        return 2

    assert (plain.acks_late, plain.ignore_result, plain.track_started) == (True, True, True)
    assert (plain.serializer, plain.typing, plain.store_errors_even_if_ignored) == (
        "json", False, False,
    )  # fmt: skip
    assert (plain.priority, plain.rate_limit, plain.reject_on_worker_lost) == (None, None, None)
    assert (plain.acks_on_failure_or_timeout, plain.acks_on_failure) == (True, True)
    assert (opted.acks_late, opted.serializer, opted.typing) == (False, "json", True)
    app.conf.task_default_rate_limit = "5/s"  # read when used, as every setting here
    assert plain.rate_limit == "5/s"
    plain.ignore_result = False  # an assignment wins
    assert plain.ignore_result is False and opted.ignore_result is True
    # ... and ignore_result from the settings is what a call honours
    assert opted.delay().ignored is True and plain.delay().ignored is False


@pytest.fixture
def tz_env() -> Iterator[None]:
    """Restore ``$TZ`` and the C library's idea of local time after the test."""
    before = os.environ.get("TZ")
    yield
    if before is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = before
    time.tzset()


def local_app() -> Celery:
    app = make()
    app.conf.enable_utc = False
    return app


@pytest.mark.parametrize(
    ("tz", "name", "hours"),
    [
        ("Asia/Tokyo", "Asia/Tokyo", 9),
        (":Asia/Tokyo", "Asia/Tokyo", 9),
        (":/usr/share/zoneinfo/Asia/Tokyo", "Asia/Tokyo", 9),
        ("/usr/share/zoneinfo/Asia/Kolkata", "Asia/Kolkata", 5.5),
        ("JST-9", "Etc/GMT-9", 9),
        ("", "UTC", 0),
    ],
)
def test_enable_utc_off_reads_the_local_time_zone(
    tz_env: None, tz: str, name: str, hours: float
) -> None:
    os.environ["TZ"] = tz
    time.tzset()
    app = local_app()
    assert app.now().utcoffset() == timedelta(hours=hours)
    assert app.timezone_name() == name
    assert app.timezone.utcoffset(datetime(2024, 1, 1)) == timedelta(hours=hours)


def test_a_posix_rule_keeps_its_daylight_saving_time(tz_env: None) -> None:
    os.environ["TZ"] = "CET-1CEST,M3.5.0,M10.5.0/3"
    time.tzset()
    zone = local_app().timezone
    assert zone.utcoffset(datetime(2024, 1, 15, 12)) == timedelta(hours=1)
    assert zone.utcoffset(datetime(2024, 7, 15, 12)) == timedelta(hours=2)
    assert zone.dst(datetime(2024, 7, 15, 12)) == timedelta(hours=1)
    summer = datetime(2024, 7, 15, 10, tzinfo=UTC).astimezone(zone)
    assert (summer.hour, summer.utcoffset()) == (12, timedelta(hours=2))


def test_without_tz_the_zone_etc_localtime_links_to(
    tz_env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.environ.pop("TZ", None)
    link = tmp_path / "localtime"
    link.symlink_to("/usr/share/zoneinfo/America/New_York")
    monkeypatch.setattr(localtz, "LOCALTIME", str(link))
    assert local_app().timezone_name() == "America/New_York"
    assert make().timezone_name() == "UTC"  # enable_utc (the default) reads no local zone
    plain = tmp_path / "plain"
    plain.write_bytes(Path("/usr/share/zoneinfo/UTC").read_bytes())
    monkeypatch.setattr(localtz, "LOCALTIME", str(plain))
    assert isinstance(local_app().timezone, localtz.LocalTimezone)  # the C library's
