"""Real Celery 5.7 (with django-celery-beat and celery-redbeat, which need it, and
psycopg for django-celery-beat on Postgres) for the
tests that compare the drop-in with Celery or play a Celery deployment: installed once per
machine with ``pip install --target`` into a directory of its own, never into the
project's venv (there, ``import celery`` must fail: the shim's opt-in alias checks it).
Processes that run Celery get it on ``PYTHONPATH``.

``PYRULA_TEST_CELERY_DIR`` names a directory that holds it already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

VERSION = "5.7.0"
PACKAGES = (
    f"celery[redis]=={VERSION}", "django-celery-beat==2.9.0", "celery-redbeat==2.4.2",
    "psycopg[binary]>=3.1",  # django-celery-beat's tables on Postgres
)  # fmt: skip


def celery_dir() -> Path:
    given = os.environ.get("PYRULA_TEST_CELERY_DIR")
    if given:
        return Path(given)
    python = f"py{sys.version_info[0]}{sys.version_info[1]}"
    target = Path.home() / ".cache" / "pyrula-tests" / f"celery-{VERSION}-beat-{python}"
    if not (target / "psycopg" / "__init__.py").exists():
        target.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *PACKAGES],
            check=True, capture_output=True,
        )  # fmt: skip
    return target


def differences_from_celery(
    script: Path, probe: Callable[[str], Any], env: dict[str, str] | None = None
) -> dict[str, tuple[Any, Any]]:
    """Run a probe ``script`` under real Celery (its ``celery`` mode, in a process with
    Celery on its path) and ``probe("pyrula_compat")`` here; return every answer that
    differs, as (Celery's, ours). Empty when the drop-in answers as Celery does."""
    out = subprocess.run(
        [sys.executable, str(script), "celery"], capture_output=True, text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(celery_dir())},
        timeout=120, check=False, cwd="/",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)
    ours = json.loads(json.dumps(probe("pyrula_compat"), sort_keys=True, default=str))
    return {k: (v, ours.get(k)) for k, v in theirs.items() if ours.get(k) != v}
