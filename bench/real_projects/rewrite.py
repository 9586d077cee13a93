"""Rewrite a checked-out project's Celery imports to ``pyrula_compat``.

What is rewritten, and nothing else:

* import statements, read with :mod:`tokenize` (so strings, comments and names such as
  ``CELERY_BROKER_URL`` or ``celery_app`` are never touched):
  ``import celery`` -> ``import pyrula_compat as celery``,
  ``import celery as c`` / ``import celery.x as y`` -> ``import pyrula_compat[.x] as ...``,
  ``import celery.x`` -> ``import pyrula_compat.x, pyrula_compat as celery``,
  ``from celery[.x] import ...`` -> ``from pyrula_compat[.x] import ...``;
* string literals that name a Celery module or an object in one, such as
  ``mock.patch("celery.app.task.Task.retry")`` or
  ``pytest_plugins = ("celery.contrib.pytest",)``: the literal's value is
  ``celery.<dotted>`` and its longest module prefix is a module of Celery 5.7;
* ``celery.contrib.pytest`` in ``setup.cfg``, ``pytest.ini``, ``tox.ini`` and
  ``pyproject.toml`` (``-p celery.contrib.pytest``, ``pytest11`` entry points).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SHIM = "pyrula_compat"
_NAME = re.compile(r"celery(\.[A-Za-z_]\w*)+")
_CONFIG_FILES = ("setup.cfg", "pytest.ini", "tox.ini", "pyproject.toml")
_CONFIG_PLUGIN = re.compile(r"(?<![\w.])celery\.contrib\.pytest\b")
_STATEMENT_START = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT}
_SKIP_DIRS = {".git", ".tox", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}


def celery_modules(source: Path) -> frozenset[str]:
    """The dotted names of the modules of the Celery package in ``source/celery``."""
    root = source / "celery"
    if not (root / "__init__.py").is_file():
        raise FileNotFoundError(f"no Celery package at {root} (pass --celery-source DIR)")
    names: set[str] = set()
    for path in root.rglob("*.py"):
        parts = path.relative_to(source).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names.add(".".join(parts))
    return frozenset(names)


@dataclass
class Edit:
    line: int  # 1-based
    col: int
    end_line: int
    end_col: int
    text: str


@dataclass
class Report:
    files: dict[str, list[str]] = field(default_factory=dict)  # path -> "line: old -> new"

    def add(self, path: str, note: str) -> None:
        self.files.setdefault(path, []).append(note)

    @property
    def count(self) -> int:
        return sum(len(v) for v in self.files.values())


def _significant(tokens: list[tokenize.TokenInfo]) -> list[tokenize.TokenInfo]:
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING}
    return [t for t in tokens if t.type not in skip]


def _starts_statement(prev: tokenize.TokenInfo | None) -> bool:
    if prev is None:
        return True
    if prev.type in _STATEMENT_START or prev.type == tokenize.ENCODING:
        return True
    return prev.type == tokenize.OP and prev.string in {";", ":"}


def _string_value(token: str) -> str | None:
    prefix = re.match(r"[A-Za-z]*", token)
    if prefix is None or prefix.group(0).lower() not in {"", "r", "u"}:
        return None
    try:
        value = ast.literal_eval(token)
    except (SyntaxError, ValueError):
        return None
    return value if isinstance(value, str) else None


def _names_celery_module(value: str, modules: frozenset[str]) -> bool:
    if not _NAME.fullmatch(value):
        return False
    parts = value.split(".")
    return any(".".join(parts[:n]) in modules for n in range(len(parts), 1, -1))


def _import_edits(toks: list[tokenize.TokenInfo], i: int) -> tuple[list[Edit], int]:
    """Edits for the ``import a.b [as c], ...`` statement whose ``import`` is ``toks[i]``."""
    edits: list[Edit] = []
    j = i + 1
    while j < len(toks):
        start = j
        dotted = [toks[j]]
        j += 1
        while j + 1 < len(toks) and toks[j].string == "." and toks[j + 1].type == tokenize.NAME:
            dotted.append(toks[j + 1])
            j += 2
        has_as = j < len(toks) and toks[j].string == "as"
        if has_as:
            j += 2
        first = toks[start]
        if first.type == tokenize.NAME and first.string == "celery":
            if has_as or len(dotted) == 1:
                text = SHIM if has_as else f"{SHIM} as celery"
                edits.append(Edit(*first.start, *first.end, text))
            else:
                rest = ".".join(t.string for t in dotted[1:])
                last = dotted[-1]
                edits.append(Edit(*first.start, *last.end, f"{SHIM}.{rest}, {SHIM} as celery"))
        if j < len(toks) and toks[j].string == ",":
            j += 1
            continue
        break
    return edits, j


def python_edits(text: str, modules: frozenset[str]) -> list[Edit]:
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    toks = _significant(tokens)
    edits: list[Edit] = []
    prev: tokenize.TokenInfo | None = None
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.type == tokenize.NAME and tok.string == "import" and _starts_statement(prev):
            found, i = _import_edits(toks, i)
            edits.extend(found)
            prev = toks[i - 1]
            continue
        if (
            tok.type == tokenize.NAME
            and tok.string == "from"
            and _starts_statement(prev)
            and i + 1 < len(toks)
            and toks[i + 1].type == tokenize.NAME
            and toks[i + 1].string == "celery"
        ):
            target = toks[i + 1]
            edits.append(Edit(*target.start, *target.end, SHIM))
        if tok.type == tokenize.STRING:
            value = _string_value(tok.string)
            if value is not None and _names_celery_module(value, modules):
                new = tok.string.replace(value, SHIM + value[len("celery") :], 1)
                edits.append(Edit(*tok.start, *tok.end, new))
        prev = tok
        i += 1
    return edits


def apply_edits(text: str, edits: Iterable[Edit]) -> str:
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    out = text
    for e in sorted(edits, key=lambda e: (e.line, e.col), reverse=True):
        a = offsets[e.line - 1] + e.col
        b = offsets[e.end_line - 1] + e.end_col
        out = out[:a] + e.text + out[b:]
    return out


def _files(root: Path) -> Iterable[Path]:
    for path in sorted(root.rglob("*")):
        if any(part in _SKIP_DIRS for part in path.relative_to(root).parts):
            continue
        if path.is_file():
            yield path


def rewrite_tree(root: Path, modules: frozenset[str]) -> Report:
    """Rewrite every Python and pytest-config file under ``root`` in place."""
    report = Report()
    for path in _files(root):
        rel = str(path.relative_to(root))
        if path.suffix == ".py":
            try:
                text = path.read_text(encoding="utf-8")
                edits = python_edits(text, modules)
            except (UnicodeDecodeError, tokenize.TokenError, SyntaxError, IndentationError):
                continue  # not Python 3 this tokenizer reads (a template, Python 2): as it was
            if edits:
                lines = text.splitlines()
                for e in edits:
                    old = lines[e.line - 1][e.col : e.end_col if e.end_line == e.line else None]
                    report.add(rel, f"{e.line}: {old} -> {e.text}")
                path.write_text(apply_edits(text, edits), encoding="utf-8")
        elif path.name in _CONFIG_FILES:
            text = path.read_text(encoding="utf-8")
            new, n = _CONFIG_PLUGIN.subn(f"{SHIM}.contrib.pytest", text)
            if n:
                report.add(rel, f"{n} x celery.contrib.pytest -> {SHIM}.contrib.pytest")
                path.write_text(new, encoding="utf-8")
    return report
