"""``celery.utils.time``, ``celery.utils.functional`` and ``celery.utils.imports``: the
same calls give the same answers as on Celery 5.7 (``helpers_probe.py`` runs them under
both), and a few answers stated here, which hold without Celery at hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from pyrula_compat.utils import functional, imports
from pyrula_compat.utils import time as ctime
from tests.compat.helpers_probe import probe
from tests.compat.real_celery import celery_dir

HERE = Path(__file__).resolve().parent


def test_the_helpers_answer_as_celerys_do() -> None:
    # Celery runs in its own interpreter: it is never importable in the project's venv
    env = {**os.environ, "PYTHONPATH": str(celery_dir()), "TZ": "UTC"}
    out = subprocess.run(
        [sys.executable, str(HERE / "helpers_probe.py"), "celery"],
        capture_output=True, text=True, env=env, timeout=120, check=False, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    ours = json.loads(json.dumps(probe("pyrula_compat"), sort_keys=True, default=str))
    theirs.pop("utcoffset"), ours.pop("utcoffset")  # this machine's zone vs TZ=UTC
    differing = {k: (theirs.get(k), ours.get(k)) for k in theirs if theirs.get(k) != ours.get(k)}
    assert not differing and set(theirs) == set(ours)


def test_time_answers() -> None:
    paris = ZoneInfo("Europe/Paris")
    assert ctime.humanize_seconds(7200, "in", " ") == "in 2.00 hours"
    assert ctime.rate("100/m") == pytest.approx(100 / 60) and ctime.weekday("Sat") == 6
    assert str(ctime.make_aware(datetime(2024, 3, 31, 2, 30), paris)) == "2024-03-31 03:30:00+02:00"
    assert ctime.make_aware(datetime(2024, 10, 27, 2, 30), paris).utcoffset() == timedelta(hours=2)
    start = datetime(2024, 5, 1, 10, tzinfo=UTC)
    assert ctime.remaining(start, timedelta(seconds=90), now=start) == timedelta(seconds=90)
    assert datetime(2024, 1, 31) + ctime.ffwd(month=2) == datetime(2024, 2, 29)
    with pytest.raises(KeyError, match="funday"):
        ctime.weekday("funday")


def test_functional_and_imports_answers() -> None:
    head = functional.head_from_fun(lambda a, *, c: None)
    assert head(1, c=2) == 1
    with pytest.raises(TypeError):
        head(1)
    assert imports.symbol_by_name("json:dumps") is json.dumps
    with pytest.raises(imports.NotAPackage, match=r"json\.decoder"):
        imports.find_module("json.decoder.inner")
    with pytest.raises(ImportError):
        imports.symbol_by_name("no_such_module_x:thing")
    assert imports.qualname(datetime) == "datetime.datetime"
