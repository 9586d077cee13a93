"""Settings without a worker: each app its own mutable defaults (a periodic task added
to one app is not in another's ``beat_schedule``), and old setting names are not read
under a namespace, as in Celery (docs/django.md)."""

from __future__ import annotations

import logging

import pytest

from pyrula_compat import Celery
from pyrula_compat.beat import schedules_of
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
    a.conf.accept_content.append("pickle")  # other mutable defaults are per app too
    assert b.conf.accept_content == ["json"]

    c = Celery("c", broker="memory://", set_as_current=False)  # the Celery docs' pattern

    @c.on_after_configure.connect
    def setup(sender: Celery, **kwargs: object) -> None:
        sender.add_periodic_task(5.0, ping.s(), name="five")

    AppWorker(c).prepare()
    assert list(c.conf.beat_schedule) == ["five"]
    assert list(a.conf.beat_schedule) == ["ping every 10"] and b.conf.beat_schedule == {}
    assert Celery("d", broker="memory://", set_as_current=False).conf.beat_schedule == {}


def test_old_names_are_not_read_under_a_namespace(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
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
    with caplog.at_level(logging.WARNING, logger="pyrula_compat"):
        assert app.conf.broker_url is None
        assert app.conf.task_always_eager is False
    assert app.conf.beat_schedule == {} and app.conf.result_expires == 86400
    assert app.conf.timezone == "Europe/Paris" and app.conf.task_serializer == "json"
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "CELERY_ALWAYS_EAGER" in warned and "CELERY_TASK_ALWAYS_EAGER" in warned
    assert "CELERY_TASK_RESULT_EXPIRES" in warned and "CELERY_RESULT_EXPIRES" in warned

    plain = Celery("plain", set_as_current=False)  # without a namespace they are read
    plain.config_from_object(settings)
    assert plain.conf.broker_url == "memory://" and plain.conf.task_always_eager is True
    assert list(plain.conf.beat_schedule) == ["x"] and plain.conf.result_expires == 60
