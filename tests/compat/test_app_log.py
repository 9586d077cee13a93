"""``app.log`` (``celery.app.log.Logging``) in this process: the signals it sends as
Celery's does, the handlers and formats it installs, and what it leaves alone.

Each test restores the logging it changed (root and ``celery.*`` handlers and levels,
``sys.stdout``/``sys.stderr``, the once-per-process flag).
"""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from pyrula_compat import Celery, signals
from pyrula_compat.app.log import Logging, TaskFormatter
from pyrula_compat.utils.log import LoggingProxy, get_task_logger, mlevel

NAMES = (None, "celery", "celery.task", "celery.redirected")


@pytest.fixture(autouse=True)
def restored_logging() -> Iterator[None]:
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in NAMES}
    propagate = logging.getLogger("celery.task").propagate
    out, err, was_setup = sys.stdout, sys.stderr, Logging._setup
    Logging._setup = False
    try:
        yield
    finally:
        for name, (handlers, level) in saved.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.level = handlers, level
        logging.getLogger("celery.task").propagate = propagate
        sys.stdout, sys.stderr, Logging._setup = out, err, was_setup
        logging.captureWarnings(False)


@pytest.fixture
def app() -> Celery:
    return Celery("logapp", broker="memory://", set_as_current=False)


def _received(signal: Any) -> tuple[list[dict[str, Any]], Any]:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        seen.append(kwargs)

    signal.connect(receiver, weak=False)
    return seen, receiver


def test_setup_sends_the_after_setup_signals_with_the_loggers_and_numeric_level(
    app: Celery,
) -> None:
    root_seen, r1 = _received(signals.after_setup_logger)
    task_seen, r2 = _received(signals.after_setup_task_logger)
    stream = io.StringIO()
    try:
        assert app.log.setup("info", stream) is False
    finally:
        signals.after_setup_logger.disconnect(r1)
        signals.after_setup_task_logger.disconnect(r2)
    assert [s["logger"] for s in root_seen] == [logging.getLogger()]
    assert [s["logger"] for s in task_seen] == [logging.getLogger("celery.task")]
    assert root_seen[0]["loglevel"] == logging.INFO and root_seen[0]["logfile"] is stream
    assert app.log.already_setup and Logging._setup
    logging.getLogger("proj.module").warning("plain %s", "line")
    assert stream.getvalue().endswith("WARNING/MainProcess] plain line\n")


def test_a_setup_logging_receiver_takes_over_and_nothing_is_configured(app: Celery) -> None:
    seen, receiver = _received(signals.setup_logging)
    before = logging.getLogger().handlers[:]
    try:
        assert app.log.setup("debug", redirect_stdouts=True) is True
    finally:
        signals.setup_logging.disconnect(receiver)
    assert seen[0]["loglevel"] == logging.DEBUG and "format" in seen[0]
    assert logging.getLogger().handlers == before
    assert sys.stdout is not None and not isinstance(sys.stdout, LoggingProxy)


def test_it_sets_up_once_per_process(app: Celery) -> None:
    first, second = io.StringIO(), io.StringIO()
    app.log.setup("info", first)
    app.log.setup("info", second)
    logging.getLogger("x").warning("once")
    assert "once" in first.getvalue() and second.getvalue() == ""


def test_hijacking_the_root_logger_is_a_setting(app: Celery) -> None:
    mine = logging.StreamHandler(io.StringIO())
    logging.getLogger().addHandler(mine)
    app.conf.worker_hijack_root_logger = False
    app.log.setup("info", io.StringIO())
    assert mine in logging.getLogger().handlers
    Logging._setup = False
    app.conf.worker_hijack_root_logger = True
    app.log.setup("info", io.StringIO())
    assert mine not in logging.getLogger().handlers


def test_task_loggers_format_with_the_running_tasks_name_and_id(app: Celery) -> None:
    stream = io.StringIO()
    app.conf.worker_task_log_format = "%(task_name)s[%(task_id)s] %(levelname)s: %(message)s"
    app.log.setup("info", stream)
    logger = get_task_logger("logapp.tasks")

    @app.task(name="logapp.speak", bind=True)
    def speak(self: Any) -> str:
        logger.info("inside")
        return str(self.request.id)

    app.conf.task_always_eager = True
    task_id = speak.apply(task_id="t-1").get()
    logger.info("outside")
    seen = stream.getvalue().splitlines()
    assert f"logapp.speak[{task_id}] INFO: inside" in seen
    assert "???[???] INFO: outside" in seen
    assert logging.getLogger("celery.task").propagate is False


def test_redirect_stdouts_to_logger_and_levels(app: Celery) -> None:
    stream = io.StringIO()
    app.log.setup("info", stream)
    proxy = app.log.redirect_stdouts_to_logger(app.log.get_default_logger(), "error")
    print("to the log")
    assert sys.stdout is proxy and sys.stderr is proxy
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    assert "ERROR/MainProcess] to the log" in stream.getvalue()
    assert app.log.get_default_logger().name == "celery"
    assert mlevel("warning") == logging.WARNING and mlevel(10) == 10
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        mlevel("loud")


def test_the_worker_redirect_sends_only_task_output_to_the_log(app: Celery) -> None:
    stream, console = io.StringIO(), io.StringIO()
    app.log.setup("info", stream)
    sys.stdout = console
    app.log.redirect_task_output("WARNING")

    @app.task(name="logapp.prints")
    def prints() -> None:
        print("from the task")

    app.conf.task_always_eager = True
    prints.apply()
    print("from the worker")
    sys.stdout.flush()
    assert "WARNING/MainProcess] from the task" in stream.getvalue()
    assert console.getvalue() == "from the worker\n"


def test_a_formatter_instance_replaces_every_format(app: Celery) -> None:
    stream = io.StringIO()
    only = logging.Formatter("ONE %(message)s")
    app.log.setup("info", stream, formatter=only)
    logging.getLogger("a").warning("root")
    get_task_logger("logapp.b").warning("task")
    assert stream.getvalue().splitlines() == ["ONE root", "ONE task"]
    assert isinstance(TaskFormatter("%(message)s"), logging.Formatter)


def test_a_proxy_inside_a_signal_handler_writes_to_the_real_stderr(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from pyrula_compat.utils.log import in_sighandler

    stream = io.StringIO()
    logger = logging.getLogger("logapp.proxy")
    logger.addHandler(logging.StreamHandler(stream))
    logger.propagate = False
    proxy = LoggingProxy(logger, "warning")
    try:
        with in_sighandler():
            proxy.write("in a handler")
        proxy.write("outside")
    finally:
        logger.handlers, logger.propagate = [], True
    assert stream.getvalue() == "outside\n"
    assert "in a handler" in capfd.readouterr().err
