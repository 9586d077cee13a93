"""The documentation's examples run as documented, as real processes.

* ``python examples/quickstart.py`` exits 0 (it asserts its own results).
* ``python -m examples.worker_process`` serves a run submitted from this test through the
  blocking client on the same SQLite file, and exits 0 on SIGTERM, leaving nothing claimed.
* Every ``python`` block in docs/quickstart.md is an excerpt of an example file, and every
  ``python`` block in the docs compiles.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import RunStatus, SqliteStore, open_store
from pyrula.workflows.sync import WorkflowClient

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _env() -> dict[str, str]:
    """This environment without a store URL, so each example uses the store it names."""
    env = dict(os.environ)
    env.pop("PYRULA_STORE_URL", None)
    return env


def test_quickstart_example_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "result: {'user_id': 42" in done.stdout
    assert "failed run: pyrula.workflows.errors.Poison" in done.stdout


@pytest.fixture
def worker_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``python -m examples.worker_process`` on a fresh SQLite file; killed at teardown."""
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.worker_process"],
            cwd=ROOT,
            env={**_env(), "PYRULA_STORE_URL": url},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc, url, log_path
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


async def _leftovers(url: str) -> tuple[list[str], list[str]]:
    """Runs still running and workers still registered in the store at ``url``."""
    store = open_store(url)
    assert isinstance(store, SqliteStore)
    await store.open()
    try:
        running = await store.list_runs(status=RunStatus.RUNNING)
        workers = await store.list_workers()
        return [r.run_id for r in running], [w.worker_id for w in workers]
    finally:
        await store.close()


@pytest.mark.slow
def test_worker_process_serves_a_run_and_stops_on_sigterm(
    worker_process: tuple[subprocess.Popen[bytes], str, Path],
) -> None:
    proc, url, log_path = worker_process
    # Submit by name, as a web process that doesn't import the workflows would (this
    # also keeps examples.workflows out of this test process's default registry).
    client = WorkflowClient(open_store(url), require_registered=False)
    try:
        run = client.submit(
            "examples.fulfil_order",
            {"order_id": "A-1", "sku": "tea", "quantity": 2, "amount_cents": 1250},
            idempotency_key="order:A-1",
        )
        result = run.result(timeout=60)
        record = run.record()
    finally:
        client.close()
    log = log_path.read_text(errors="replace")
    assert result == {
        "order_id": "A-1",
        "stock": {"sku": "tea", "quantity": 2, "reservation": "res-tea-2"},
        "payment": {"order_id": "A-1", "charged": 1250, "attempt": 1},
        "label": "label:A-1:res-tea-2",
    }, log
    assert record.status is RunStatus.COMPLETED
    assert record.worker_id is not None and f"-{proc.pid}-" in record.worker_id, record

    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, log_path.read_text(errors="replace")
    running, workers = asyncio.run(_leftovers(url))
    assert running == [] and workers == []


def _python_blocks(path: Path) -> list[str]:
    return [textwrap.dedent(block) for block in PYTHON_BLOCK.findall(path.read_text())]


def test_quickstart_doc_blocks_are_taken_from_the_examples() -> None:
    sources = {p.name: p.read_text() for p in EXAMPLES.glob("*.py")}
    blocks = _python_blocks(DOCS / "quickstart.md")
    assert blocks, "docs/quickstart.md has no python blocks"
    for block in blocks:
        lines = [line for line in block.strip().splitlines() if line.strip() != "..."]
        excerpt = textwrap.dedent("\n".join(lines))
        found = [
            name
            for name, source in sources.items()
            if all(_in_order(excerpt.splitlines(), source.splitlines()))
        ]
        assert found, f"this docs/quickstart.md block is in no examples/*.py file:\n{block}"


def _in_order(wanted: list[str], source: list[str]) -> Iterator[bool]:
    """For each wanted line, whether it occurs (stripped) after the previous match."""
    position = 0
    for line in wanted:
        target = line.strip()
        if not target:
            continue
        while position < len(source) and source[position].strip() != target:
            position += 1
        yield position < len(source)
        position += 1
