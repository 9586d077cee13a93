"""The examples of the time, signal, composition, schedule, flow-control and testing pages
run as documented, as real processes, and those pages' code blocks and links hold up.

Each example asserts its own results and exits non-zero if one is wrong; the test also
checks a line of its output so an example that silently skipped its work fails here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
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
)
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")

EXAMPLE_OUTPUT = {
    "durable_time.py": ["trial: {'user': 'ana', 'days': 14.0}", "partner: {'attempt': 2}"],
    "signals.py": ["approved from sync code:", "InvalidRunState:", "RunNotFound:"],
    "composition.py": ["ship_order: ['label:p1', 'failed: cannot ship bad-p2', 'label:p3']"],
    "schedules.py": ["nightly runs in 3 virtual days: 3", "runs from 2 workers"],
    "flow_control.py": ["claim order: b S b S b S", "30 runs at 10/s started over"],
    "testing_env.py": ["crash before step 'charge' at 0: ('result', 100)"],
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


@pytest.mark.parametrize("name", PAGES)
def test_page_python_blocks_compile(name: str) -> None:
    text = (DOCS / name).read_text()
    for index, block in enumerate(PYTHON_BLOCK.findall(text)):
        flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        try:
            compile(textwrap.dedent(block), f"{name}[{index}]", "exec", flags=flags)
        except SyntaxError as exc:
            pytest.fail(f"python block {index} of docs/{name} does not compile: {exc}\n{block}")


def _anchors(path: Path) -> set[str]:
    """GitHub-style anchors of the headings in a markdown file."""
    anchors = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif line.startswith("#") and not in_code:
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("name", (*PAGES, "index.md"))
def test_page_links_resolve(name: str) -> None:
    page = DOCS / name
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        assert linked.exists(), f"docs/{name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"docs/{name} links to a missing anchor {target}"


def test_every_page_is_linked_from_the_index() -> None:
    index = (DOCS / "index.md").read_text()
    for name in PAGES:
        assert f"]({name}" in index, f"docs/index.md does not link {name}"


@pytest.mark.parametrize("name", sorted(EXAMPLE_OUTPUT))
def test_each_example_is_linked_from_its_page(name: str) -> None:
    pages = " ".join((DOCS / page).read_text() for page in PAGES)
    assert f"examples/{name}" in pages, f"no docs page points to examples/{name}"
