"""The examples of the time, signal, composition, schedule, flow-control and testing pages
run as documented, as real processes, and those pages' code blocks and links hold up.

Each example asserts its own results and exits non-zero if one is wrong; the test also
checks a line of its output so an example that silently skipped its work fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
PAGES = (
    "durable-time.md",
    "signals.md",
    "composition.md",
    "schedules.md",
    "fairness.md",
    "flow-control.md",
    "testing.md",
    "cli.md",
    "worker.md",
    "triggers.md",
    "projections.md",
)
LINK = re.compile(r"\]\(([^)\s]+)\)")

EXAMPLE_OUTPUT = {
    "durable_time.py": ["trial: {'user': 'ana', 'days': 14.0}", "partner: {'attempt': 2}"],
    "signals.py": ["approved from sync code:", "InvalidRunState:", "RunNotFound:"],
    "composition.py": [
        "ship_order: ['label:p1', 'failed: cannot ship bad-p2', 'label:p3']",
        "dispatch after retry: notified: booked label:p7",
    ],
    "schedules.py": ["nightly runs in 3 virtual days: 3", "runs from 2 workers"],
    "schedule_overlap.py": [
        "skip: 4 runs in 10 minutes, at most 1 at once; 6 slots skipped",
        "allow_all: 10 runs in 10 minutes, at most 3 at once",
    ],
    "flow_control.py": ["claim order: b S b S b S", "30 runs at 10/s started over"],
    "testing_env.py": ["crash before step 'charge' at 0: ('result', 100)"],
    "retention.py": ["results: [4, 9, 16]", "3 of 3 deleted; the sleeping run is sleeping"],
    "batch_triggers.py": ["231 events in", "every event once, in each sender's order"],
    "projections.py": ["30 orders in the read model, failed: ['o0', 'o14', 'o21', 'o28', 'o7']"],
}


def _env() -> dict[str, str]:
    """This environment without a store URL, so each example uses the store it names."""
    env = dict(os.environ)
    env.pop("PYRULA_STORE_URL", None)
    return env


@pytest.mark.parametrize("name", sorted(EXAMPLE_OUTPUT))
def test_example_runs(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for line in EXAMPLE_OUTPUT[name]:
        assert line in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(EXAMPLE_OUTPUT))
def test_each_example_is_linked_from_its_page(name: str) -> None:
    pages = " ".join((DOCS / page).read_text() for page in PAGES)
    assert f"examples/{name}" in pages, f"no docs page points to examples/{name}"
