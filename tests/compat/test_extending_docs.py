"""docs/coming-from-celery.md's "Extending Celery's classes": each python block is an
excerpt of examples/extending_celery.py, and the example runs (it asserts its own
results: the ContextTask's scope, the singleton's one run, the bootstep's file)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.compat.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "extending_celery.py"
PAGE = REPO_ROOT / "docs" / "coming-from-celery.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def section() -> str:
    text = PAGE.read_text()
    return text.split("## Extending Celery's classes", 1)[1].split("\n## ", 1)[0]


def test_every_block_is_an_excerpt_of_the_example() -> None:
    blocks = BLOCK.findall(section())
    assert len(blocks) == 3
    source = EXAMPLE.read_text()
    for block in blocks:
        assert textwrap.dedent(block).strip() in source, block


@pytest.mark.slow
def test_the_example_runs() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYRULA_STORE_URL", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "report: {'order': 42, 'scope': 'open'}" in done.stdout
    assert "singleton: extending.rebuild_index:7 == extending.rebuild_index:7" in done.stdout
    assert "heartbeat file removed at the stop" in done.stdout
