"""Names projects import from ``celery``, ``celery.app``, ``celery.exceptions``,
``celery.schedules`` and ``celery.signals`` besides the main ones (no worker, no server)."""

from __future__ import annotations

import logging
import warnings

import click
import pytest

import pyrula_compat
from pyrula_compat import Celery, exceptions, signals
from pyrula_compat import app as app_module
from pyrula_compat.schedules import crontab_parser


def test_version_names() -> None:
    assert pyrula_compat.VERSION == (5, 7, 0, "", "") and pyrula_compat.VERSION.major == 5
    assert pyrula_compat.version_info is pyrula_compat.VERSION
    assert pyrula_compat.VERSION_BANNER == "5.7.0 (collider)"
    assert pyrula_compat.version_info_t._fields == (
        "major", "minor", "micro", "releaselevel", "serial",
    )  # fmt: skip
    assert pyrula_compat.local.Proxy is not None


def test_bugreport_masks_secrets() -> None:
    app = Celery("report", broker="redis://user:hunter2@localhost:6379/0", set_as_current=False)
    app.conf.update(stripe_api_key="sk_live_1", my_setting="shown")
    report = pyrula_compat.bugreport(app)
    assert app_module.bugreport is pyrula_compat.bugreport
    assert "hunter2" not in report and "sk_live_1" not in report
    assert "redis://user:********@localhost:6379/0" in report
    assert "my_setting: 'shown'" in report and "celery API:5.7.0 (collider)" in report


def test_app_or_default_and_its_trace(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("given", broker="memory://", set_as_current=False)
    current = Celery("current", broker="memory://")
    current.set_current()
    assert app_module.app_or_default(app) is app
    assert app_module.app_or_default() is current
    app_module.enable_trace()
    try:
        with caplog.at_level(logging.WARNING, logger="celery.app.trace"):
            assert app_module.app_or_default() is current
            assert app_module.app_or_default(app) is app  # no fallback, no trace
    finally:
        app_module.disable_trace()
    assert caplog.text.count("RETURNING TO CURRENT APP") == 1
    assert "test_app_or_default_and_its_trace" in caplog.text  # the caller's stack


def test_push_and_pop_current_task() -> None:
    app = Celery("tasks", broker="memory://", set_as_current=False)

    @app.task(name="t.one")
    def one() -> None: ...

    assert not pyrula_compat.current_task
    app_module.push_current_task(one)
    assert pyrula_compat.current_task.name == "t.one"
    assert app_module.pop_current_task() is one
    assert not pyrula_compat.current_task and app_module.pop_current_task() is None


def test_exception_tree_as_celerys() -> None:
    assert issubclass(exceptions.AlwaysEagerIgnored, exceptions.CeleryWarning)
    assert issubclass(exceptions.CeleryWarning, UserWarning)
    assert issubclass(exceptions.DuplicateTaskNameWarning, exceptions.CeleryWarning)
    assert issubclass(exceptions.CDeprecationWarning, DeprecationWarning)
    assert issubclass(exceptions.CPendingDeprecationWarning, PendingDeprecationWarning)
    assert issubclass(exceptions.WorkerShutdown, SystemExit)
    assert exceptions.SystemTerminate is exceptions.WorkerTerminate
    assert issubclass(exceptions.AlreadyRegistered, exceptions.TaskError)
    assert issubclass(exceptions.SecurityError, exceptions.CeleryError)
    assert issubclass(exceptions.BackendGetMetaError, exceptions.BackendError)
    err = exceptions.BackendStoreError("write failed", state="SUCCESS", task_id="t1")
    assert repr(err) == "BackendStoreError('write failed') state:SUCCESS task_id:t1"
    assert repr(exceptions.BackendGetMetaError("x", task_id="t2")).endswith(" task_id:t2")
    command = exceptions.CeleryCommandException("bad", exit_code=3)
    assert isinstance(command, click.ClickException) and command.exit_code == 3
    assert set(exceptions.__all__) >= {"reraise", "WorkerShutdown", "BackendError"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(exceptions.DuplicateNodenameWarning):
            warnings.warn("twice", exceptions.DuplicateNodenameWarning, stacklevel=1)


def test_reraise_raises_the_value_with_the_traceback() -> None:
    try:
        raise ValueError("first")
    except ValueError as exc:
        tb = exc.__traceback__
        caught = exc
    with pytest.raises(ValueError, match="first") as info:
        exceptions.reraise(ValueError, caught, tb)
    assert info.value is caught


def test_crontab_parser_reads_fields_as_celerys() -> None:
    assert crontab_parser(60).parse("*/15") == {0, 15, 30, 45}
    assert crontab_parser(24).parse("22-2") == {22, 23, 0, 1, 2}
    assert crontab_parser(7).parse("mon-fri") == {1, 2, 3, 4, 5}
    assert crontab_parser(31, 1).parse("1,15") == {1, 15}
    assert crontab_parser(12, 1).parse("jan,*/6") == {1, 7}
    with pytest.raises(ValueError, match="Invalid end range: 25 > 23"):
        crontab_parser(24).parse("25")
    with pytest.raises(crontab_parser.ParseException):
        crontab_parser(60).parse("*/x")


def test_the_eventlet_pool_signals_exist_and_connect() -> None:
    heard: list[str] = []
    signals.eventlet_pool_started.connect(lambda **kw: heard.append("started"), weak=False)
    signals.eventlet_pool_started.send(sender=None)
    assert heard == ["started"]
    assert signals.eventlet_pool_apply.providing_args == {"target", "args", "kwargs"}
