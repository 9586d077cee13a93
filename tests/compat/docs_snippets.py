"""The snippets of docs/coming-from-celery.md, and the app they run on.

Imported by ``tests/compat/test_docs.py`` and, as ``pyrula worker -A docs_snippets``, by
the worker those tests start. The page's ``proj/tasks.py`` block and every python
snippet's definitions (imports, functions, classes: the tasks) are executed here, in one
namespace named ``proj.tasks``, so a task has the same name (``proj.tasks.add``) in the
worker and in the test process; the test process then runs each snippet's other
statements in a copy of that namespace. ``DOCS_BEAT=1`` also runs the beat snippet, as a
project's ``celery.py`` would.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path
from typing import Any

from pyrula_compat import Celery

DOC = Path(__file__).resolve().parents[2] / "docs" / "coming-from-celery.md"
HEADING = re.compile(r"^#### (\d+)\. .*$", re.MULTILINE)
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.DOTALL | re.MULTILINE)
ROW_LINK = re.compile(r"^\| \[(\d+)\]\(#([\w-]+)\) \|", re.MULTILINE)
DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
BEAT = 20


class Snippet:
    def __init__(self, number: int, language: str | None, code: str) -> None:
        self.number = number
        self.language = language
        self.code = code

    def parts(self) -> tuple[ast.Module, ast.Module]:
        """(the definitions, the other statements) of a python snippet."""
        tree = ast.parse(self.code)
        defs = [n for n in tree.body if isinstance(n, DEFINITIONS)]
        rest = [n for n in tree.body if not isinstance(n, DEFINITIONS)]
        return ast.Module(defs, type_ignores=[]), ast.Module(rest, type_ignores=[])

    def commands(self) -> list[list[str]]:
        """The command lines of a bash snippet, without comments."""
        lines = (line.split("#", 1)[0].split() for line in self.code.splitlines())
        return [words for words in lines if words]


def page() -> str:
    return DOC.read_text()


def snippets() -> dict[int, Snippet]:
    """The snippets below the concept map, by number: one code block or none each."""
    text = page()
    section = text.split("### Snippets", 1)[1].split("## What the shim does", 1)[0]
    heads = list(HEADING.finditer(section))
    found: dict[int, Snippet] = {}
    for head, after in zip(heads, [*heads[1:], None], strict=True):
        body = section[head.end() : after.start() if after else len(section)]
        blocks = BLOCK.findall(body)
        assert len(blocks) <= 1, f"snippet {head.group(1)} has {len(blocks)} code blocks"
        language, code = blocks[0] if blocks else (None, "")
        found[int(head.group(1))] = Snippet(int(head.group(1)), language, code)
    return found


def row_links() -> list[tuple[int, str]]:
    """(number, anchor) of each concept-map row."""
    text = page().split("## Concept map", 1)[1].split("### Snippets", 1)[0]
    return [(int(n), anchor) for n, anchor in ROW_LINK.findall(text)]


def example_tasks() -> str:
    """The ``proj/tasks.py`` block of the whole example, without its relative import."""
    text = page().split("`proj/tasks.py`:", 1)[1]
    code = BLOCK.findall(text)[0][1]
    return code.replace("from .celery import app\n", "")


app = Celery("proj", broker=os.environ.get("CELERY_BROKER_URL", "memory://"))
NAMESPACE: dict[str, Any] = {"__name__": "proj.tasks", "app": app}
exec(compile(example_tasks(), f"{DOC.name}[proj/tasks.py]", "exec"), NAMESPACE)
for _snippet in snippets().values():
    if _snippet.language == "python":
        _defs, _rest = _snippet.parts()
        exec(compile(_defs, f"{DOC.name}[{_snippet.number}]", "exec"), NAMESPACE)
        if _snippet.number == BEAT and os.environ.get("DOCS_BEAT"):
            exec(compile(_rest, f"{DOC.name}[{_snippet.number}]", "exec"), NAMESPACE)
