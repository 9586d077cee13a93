"""``config_from_object`` keeps its source and reads it on every lookup, as Celery's
``Settings`` (a ChainMap over the changes, the source and the defaults) does: a setting
changed on a module, class, instance, mapping or Django's settings after the app loaded
it takes effect at the next call; ``app.conf`` changes still win over the source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Celery
from pyrula_compat.result import EagerResult
from tests.compat.conftest import HERE, REPO_ROOT


class Config:
    task_always_eager = False
    task_default_queue = "first"


def sources() -> list[tuple[str, Any, Any]]:
    """(kind, the source passed to config_from_object, the object a test changes)."""
    module = types.ModuleType("live_conf_module")
    module.task_always_eager = False
    module.task_default_queue = "first"
    sys.modules["live_conf_module"] = module
    holder = types.ModuleType("live_conf_holder")
    holder.CONF = types.SimpleNamespace(task_always_eager=False, task_default_queue="first")
    sys.modules["live_conf_holder"] = holder
    klass = type("Conf", (), {"task_always_eager": False, "task_default_queue": "first"})
    mapping = {"task_always_eager": False, "task_default_queue": "first"}
    instance = types.SimpleNamespace(task_always_eager=False, task_default_queue="first")
    return [
        ("module", module, module),
        ("module path", "live_conf_module", module),
        ("module:attr", "live_conf_holder:CONF", holder.CONF),
        ("module.attr", "live_conf_holder.CONF", holder.CONF),
        ("class", klass, klass),
        ("instance", instance, instance),
        ("mapping", mapping, mapping),
    ]


def change(target: Any, key: str, value: Any) -> None:
    if isinstance(target, dict):
        target[key] = value
    else:
        setattr(target, key, value)


@pytest.mark.parametrize("kind", [kind for kind, _, _ in sources()])
def test_a_source_changed_later_takes_effect_at_the_next_call(kind: str) -> None:
    _, source, target = next(s for s in sources() if s[0] == kind)
    app = Celery("live", broker="memory://", set_as_current=False)
    app.config_from_object(source)

    @app.task(name="live.double")
    def double(x: int) -> int:
        return x * 2

    assert app.conf.task_always_eager is False and app.conf.task_default_queue == "first"
    queued = double.delay(2)
    assert not isinstance(queued, EagerResult) and queued.state == "PENDING"
    change(target, "task_always_eager", True)
    change(target, "task_default_queue", "second")
    ran = double.delay(3)  # the next call reads the source again
    assert isinstance(ran, EagerResult) and ran.get() == 6
    assert app.conf.task_default_queue == "second" == app.conf.task_default_routing_key
    change(target, "task_soft_time_limit", 5)  # a setting the source did not have
    assert app.conf.task_soft_time_limit == 5 and double.soft_time_limit == 5
    app.conf.task_default_queue = "set"  # app.conf wins over the source, as in Celery
    change(target, "task_default_queue", "third")
    assert app.conf.task_default_queue == "set"
    del app.conf["task_default_queue"]
    assert app.conf.task_default_queue == "third"
    app.conf.update(task_always_eager=False)
    assert not isinstance(double.delay(4), EagerResult)


def test_eager_propagates_read_at_each_call() -> None:
    settings = {"task_always_eager": True, "task_eager_propagates": False}
    app = Celery("live", broker="memory://", set_as_current=False)
    app.config_from_object(settings)

    @app.task(name="live.boom")
    def boom() -> None:
        raise KeyError("boom")

    assert boom.delay().state == "FAILURE"
    settings["task_eager_propagates"] = True
    with pytest.raises(KeyError, match="boom"):
        boom.delay()


def test_old_and_namespaced_names_are_read_live(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    old = types.ModuleType("old_style_conf")
    old.CELERY_ALWAYS_EAGER = False
    old.BROKER_URL = "memory://"
    app = Celery("old", set_as_current=False)
    app.config_from_object(old)
    assert app.conf.task_always_eager is False and app.conf.broker_url == "memory://"
    monkeypatch.setattr(old, "CELERY_ALWAYS_EAGER", True)
    assert app.conf.task_always_eager is True and app.conf.CELERY_ALWAYS_EAGER is True

    settings = types.SimpleNamespace(CELERY_TASK_ALWAYS_EAGER=False, DEBUG=True)
    django_like = Celery("ns", broker="memory://", set_as_current=False)
    django_like.config_from_object(settings, namespace="CELERY")
    assert django_like.conf.task_always_eager is False
    monkeypatch.setattr(settings, "CELERY_TASK_ALWAYS_EAGER", True)
    assert django_like.conf.task_always_eager is True
    monkeypatch.undo()
    assert django_like.conf.task_always_eager is False  # undone, read again
    settings.CELERY_TASK_DEFAULT_QUEUE = "added"
    assert django_like.conf.task_default_queue == "added"
    assert "task_default_queue" in django_like.conf and "DEBUG" not in list(django_like.conf)


def test_a_source_that_mixes_old_and_new_names_still_raises() -> None:
    from pyrula_compat.exceptions import ImproperlyConfigured

    app = Celery("mix", broker="memory://", set_as_current=False)
    app.config_from_object({"CELERY_ALWAYS_EAGER": True, "task_default_queue": "x"})
    with pytest.raises(ImproperlyConfigured, match="Cannot mix new and old setting keys"):
        app.conf.task_always_eager  # noqa: B018


DJANGO_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    os.environ["DJANGO_SETTINGS_MODULE"] = "djproj.settings"
    os.environ["DJPROJ_BROKER"] = "memory://"
    import django
    django.setup()
    import pytest
    from django.conf import settings
    from django.test import override_settings
    from djproj.celery import app
    from pyrula_compat.result import EagerResult

    @app.task(name="djproj.live_add")
    def add(x, y):
        return x + y

    seen = {}
    seen["before"] = isinstance(add.delay(1, 2), EagerResult)
    with override_settings(CELERY_TASK_ALWAYS_EAGER=True, CELERY_TASK_DEFAULT_QUEUE="q2"):
        result = add.delay(2, 3)
        seen["override"] = [isinstance(result, EagerResult), result.get(),
                            app.conf.task_default_queue]
    seen["after_override"] = [isinstance(add.delay(1, 1), EagerResult),
                              app.conf.task_default_queue]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(settings, "CELERY_TASK_ALWAYS_EAGER", True, raising=False)
        seen["monkeypatch"] = isinstance(add.delay(1, 2), EagerResult)
    seen["after_monkeypatch"] = isinstance(add.delay(1, 2), EagerResult)
    seen["timezone"] = app.conf.timezone
    print(json.dumps(seen))
    """
)


def test_django_settings_are_read_live_with_override_settings(tmp_path: Path) -> None:
    pytest.importorskip("django")
    script = tmp_path / "live_django.py"
    script.write_text(DJANGO_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    env.pop("CELERY_BROKER_URL", None)
    env.pop("PYRULA_STORE_URL", None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "before": False,
        "override": [True, 5, "q2"],
        "after_override": [False, "celery"],
        "monkeypatch": True,
        "after_monkeypatch": False,
        "timezone": "UTC",
    }
