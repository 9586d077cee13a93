"""An invalid ``beat_schedule`` entry (every 0 s, a negative number, a schedule of no
known type, an entry that is no dict) stops ``pyrula worker -A`` and ``pyrula beat -A``
with one line naming the entry and the setting, never a traceback; the ``amqp://``
refusal shows the broker URL with only its password masked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pyrula_compat import Celery
from pyrula_compat.beat import schedules_of
from pyrula_compat.exceptions import ImproperlyConfigured
from pyrula_compat.store import masked, store_url
from tests.compat.conftest import HERE, REPO_ROOT, pyrula_command

ENTRIES = {
    "every-zero": "every= must be at least one second, got 0.0",
    "negative": "every= must be at least one second, got -5.0",
    "zero-timedelta": "every= must be at least one second, got 0.0",
    "unknown-type": "is not a crontab, a schedule, a timedelta or a number of seconds",
    "not-a-dict": "an entry is a dict with 'task' and 'schedule', got 5",
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_an_invalid_entry_raises_naming_it(entry: str) -> None:
    import proj_badbeat

    app = proj_badbeat.app
    app.conf.beat_schedule = {entry: proj_badbeat.BAD[entry]}
    try:
        with pytest.raises(ImproperlyConfigured) as raised:
            schedules_of(app)
    finally:
        app.conf.beat_schedule = {}
    assert str(raised.value).startswith(f"beat_schedule[{entry!r}]")
    assert ENTRIES[entry] in str(raised.value)


@pytest.mark.slow
@pytest.mark.parametrize(("command", "entry"), [("worker", "every-zero"), ("beat", "negative"),
                                                ("worker", "not-a-dict")])  # fmt: skip
def test_worker_and_beat_stop_with_one_line(command: str, entry: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    env.pop("PYRULA_STORE_URL", None)
    env.update(CELERY_BROKER_URL=f"sqlite:///{tmp_path / 'b.db'}", PROJ_BAD_ENTRY=entry)
    done = subprocess.run(
        [*pyrula_command(), command, "-A", "proj_badbeat"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: -A proj_badbeat: beat_schedule[{entry!r}]")
    assert ENTRIES[entry] in lines[0]


def test_the_amqp_refusal_masks_only_the_password() -> None:
    assert masked("amqp://guest@localhost//") == "amqp://guest@localhost//"
    assert masked("amqp://u:secret@h//") == "amqp://u:**@h//"
    assert masked("amqp://u:p@ss@h:5672/v?x=1") == "amqp://u:**@h:5672/v?x=1"
    assert masked("redis://:pw@h:6379/0") == "redis://:**@h:6379/0"
    assert masked("sqlite:///x.db") == "sqlite:///x.db"
    with pytest.raises(ImproperlyConfigured, match=r"broker 'amqp://guest@localhost//': pyrula"):
        store_url("amqp://guest@localhost//", None)
    with pytest.raises(ImproperlyConfigured) as raised:
        store_url("amqp://u:secret@h//", None)
    assert "'amqp://u:**@h//'" in str(raised.value) and "secret" not in str(raised.value)
    app = Celery("amqp", broker="amqp://u:secret@rabbit:5672//", set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match=r"amqp://u:\*\*@rabbit:5672//"):
        app.send_task("x.y")
