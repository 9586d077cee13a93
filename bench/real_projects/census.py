"""The Celery names a rewritten project imports that ``pyrula_compat`` lacks.

    python census.py CHECKOUT      # run with the shim venv's python; prints JSON

Read with :mod:`ast` from every Python file of the checkout (``docs/`` left out):
``from pyrula_compat.x import y``, ``import pyrula_compat.x`` and string literals naming
``pyrula_compat.x.y`` (``mock.patch`` targets). A suite stops at the first name missing
at import time; this lists every one, so the names behind the first are known too.
Output: ``{"<missing name>": ["<file>:<line>", ...]}``.
"""

from __future__ import annotations

import ast
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

SHIM = "pyrula_compat"


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _missing_from(module: str, name: str) -> str | None:
    found = _module(module)
    if found is None:
        return f"module {module}"
    if hasattr(found, name) or _module(f"{module}.{name}") is not None:
        return None
    return f"{module}.{name}"


def _missing_dotted(value: str) -> str | None:
    parts = value.split(".")
    for n in range(len(parts), 0, -1):
        obj: object = _module(".".join(parts[:n]))
        if obj is not None:
            break
    else:
        return f"module {parts[0]}"
    for i in range(n, len(parts)):
        if not hasattr(obj, parts[i]):
            return ".".join(parts[: i + 1])
        obj = getattr(obj, parts[i])
    return None


def census(root: Path) -> dict[str, list[str]]:
    missing: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in {"docs", ".git"}:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            found: list[str | None] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == SHIM:
                    found = [_missing_from(node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found = [
                    None if _module(a.name) else f"module {a.name}"
                    for a in node.names
                    if a.name.split(".")[0] == SHIM
                ]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith(SHIM + ".")
                and " " not in node.value
            ):
                found = [_missing_dotted(node.value)]
            for name in found:
                where = f"{rel}:{getattr(node, 'lineno', 0)}"
                if name is not None and where not in missing.get(name, []):
                    missing.setdefault(name, []).append(where)
    return missing


if __name__ == "__main__":
    print(json.dumps(census(Path(sys.argv[1]))))
