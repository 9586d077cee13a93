"""Write ``celery57.json``: the public names of Celery 5.7 that the drop-in mirrors.

Test tooling only: it imports a real Celery, which is never installed in the project's
venv, so run it with Celery on the path of a separate interpreter::

    python3 -m pip install --target DIR "celery==5.7.0"
    PYTHONPATH=DIR python3 tests/compat/census/make_census.py

(``--check`` compares instead of writing, and fails when the file is stale).

What counts as public:

- a module's names are its ``__all__`` when it defines one, without the names that
  start with an underscore (``celery``'s ``__all__`` lists ``__version__`` and such,
  which are metadata, not API); a module without ``__all__`` (``celery.contrib.pytest``,
  ``celery.contrib.testing.*``) counts the names its own source binds at top level by a
  ``def``, ``class`` or assignment, without a leading underscore: what it imports from
  elsewhere (``typing.Any``, ``os``, ``Celery`` in ``celery.contrib.testing.app``) is not
  its API. ``celery.contrib.testing`` itself binds nothing; its API is its submodules;
- a class's names are ``dir(cls)`` without a leading underscore: every method,
  property and class attribute a user can reach on it, inherited ones included.

``test_census.py`` checks every name against the matching ``pyrula_compat`` module or
class, less the names ``exclusions.json`` lists with the reason each one cannot apply.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("celery57.json")

MODULES = [
    "celery",
    "celery.app",
    "celery.app.log",
    "celery.app.task",
    "celery.bootsteps",
    "celery.canvas",
    "celery.contrib.abortable",
    "celery.contrib.pytest",
    "celery.contrib.testing.app",
    "celery.contrib.testing.manager",
    "celery.contrib.testing.mocks",
    "celery.contrib.testing.worker",
    "celery.exceptions",
    "celery.local",
    "celery.result",
    "celery.schedules",
    "celery.signals",
    "celery.states",
    "celery.utils.dispatch",
    "celery.utils.dispatch.signal",
    "celery.utils.functional",
    "celery.utils.imports",
    "celery.utils.log",
    "celery.utils.time",
]

# census name -> where Celery defines the class
CLASSES = {
    "Celery": "celery.app.base:Celery",
    "Task": "celery.app.task:Task",
    "AsyncResult": "celery.result:AsyncResult",
    "GroupResult": "celery.result:GroupResult",
    "Signature": "celery.canvas:Signature",
    "chain": "celery.canvas:chain",
    "group": "celery.canvas:group",
    "chord": "celery.canvas:chord",
}


def module_names(name: str) -> list[str]:
    module = importlib.import_module(name)
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted({n for n in declared if not n.startswith("_")})
    source = Path(inspect.getfile(module)).read_text(encoding="utf-8")
    return sorted(n for n in bound_at_top_level(ast.parse(source)) if not n.startswith("_"))


def bound_at_top_level(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names.update(t.id for t in ast.walk(target) if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def class_names(path: str) -> list[str]:
    module_name, _, attr = path.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    return sorted(n for n in dir(cls) if not n.startswith("_"))


def census() -> dict[str, Any]:
    import celery

    return {
        "celery_version": celery.__version__,
        "modules": {name: module_names(name) for name in MODULES},
        "classes": {
            name: {"celery": path, "names": class_names(path)} for name, path in CLASSES.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is stale")
    args = parser.parse_args()
    text = json.dumps(census(), indent=1, sort_keys=True) + "\n"
    if args.check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} differs from the installed Celery's census", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
