"""The examples in examples/ run to the end (each asserts its own result) in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["examples/from_celery.py", "examples/demo.py"])
def test_example_runs(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYRULA_STORE_URL"}
    done = subprocess.run(
        [sys.executable, script],
        cwd=REPO_ROOT,
        env=env,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"


def test_from_celery_restores_the_seed_address() -> None:
    text = (REPO_ROOT / "examples" / "from_celery.py").read_text()
    assert '{"sent_to": "user-42@example.com", "attempts": 2}' in text
    assert "protected]" not in text
