"""Every page in ``docs/`` (and the README): python blocks compile, links and anchors resolve."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub-style anchors of the headings of a markdown file (not inside code)."""
    found = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif line.startswith("#") and not in_code:
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


@pytest.mark.parametrize("name", PAGES)
def test_python_blocks_compile(name: str) -> None:
    text = (DOCS / name).read_text()
    for index, block in enumerate(PYTHON_BLOCK.findall(text)):
        flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        try:
            compile(textwrap.dedent(block), f"{name}[{index}]", "exec", flags=flags)
        except SyntaxError as exc:
            pytest.fail(f"python block {index} of docs/{name} does not compile: {exc}\n{block}")


@pytest.mark.parametrize("path", [DOCS / name for name in PAGES] + [ROOT / "README.md"], ids=str)
def test_links_and_anchors_resolve(path: Path) -> None:
    for target in LINK.findall(path.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        assert linked.exists(), f"{path.name} links to {target}, which does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{path.name} links to a missing anchor {target}"


@pytest.mark.parametrize("name", [n for n in PAGES if n != "index.md"])
def test_every_page_is_linked_from_the_index(name: str) -> None:
    assert f"({name}" in (DOCS / "index.md").read_text(), f"docs/index.md does not link {name}"
