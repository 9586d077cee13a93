"""The census: Celery 5.7's public names, present in ``pyrula_compat`` or excused.

``census/celery57.json`` is written from a real Celery by ``census/make_census.py``
(which says what counts as public); ``census/exclusions.json`` names what cannot apply
to a durable engine, each with its reason. Every other listed name must be present in
the matching ``pyrula_compat`` module or class, and at least 95 % of all listed names
must be present. ``python tests/compat/test_census.py`` prints the figures.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).with_name("census")
CENSUS: dict[str, Any] = json.loads((HERE / "celery57.json").read_text(encoding="utf-8"))
EXCLUDED: dict[str, dict[str, dict[str, str]]] = json.loads(
    (HERE / "exclusions.json").read_text(encoding="utf-8")
)
TARGET = 0.95

# census class -> (pyrula_compat path, a sample instance, whose dir() also counts:
# attributes set in __init__ are as present to a user as class attributes)
CLASSES: dict[str, tuple[str, Callable[[], Any]]] = {
    "Celery": ("pyrula_compat.app.base:Celery", lambda: _app()),
    "Task": ("pyrula_compat.app.task:Task", lambda: _app().task(name="census.t")(_body)),
    "AsyncResult": ("pyrula_compat.result:AsyncResult", lambda: _app().AsyncResult("census")),
    "GroupResult": ("pyrula_compat.result:GroupResult", lambda: _app().GroupResult("g", [])),
    "Signature": ("pyrula_compat.canvas:Signature", lambda: _canvas().Signature("census.t")),
    "chain": ("pyrula_compat.canvas:chain", lambda: _canvas().chain(_sig(), _sig())),
    "group": ("pyrula_compat.canvas:group", lambda: _canvas().group(_sig(), _sig())),
    "chord": ("pyrula_compat.canvas:chord", lambda: _canvas().chord([_sig()], _sig())),
}


def _body(x: int) -> int:
    return x


def _app() -> Any:
    from pyrula_compat import Celery

    return Celery("census", broker="memory://")


def _canvas() -> Any:
    return importlib.import_module("pyrula_compat.canvas")


def _sig() -> Any:
    return _canvas().Signature("census.t")


def shim_module(celery_name: str) -> str:
    return "pyrula_compat" + celery_name[len("celery") :]


def module_missing(celery_name: str) -> list[str]:
    try:
        module = importlib.import_module(shim_module(celery_name))
    except ImportError:
        return list(CENSUS["modules"][celery_name])
    return [n for n in CENSUS["modules"][celery_name] if not hasattr(module, n)]


def class_missing(name: str) -> list[str]:
    path, sample = CLASSES[name]
    module_name, _, attr = path.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return list(CENSUS["classes"][name]["names"])
    have = set(dir(cls))
    missing = [n for n in CENSUS["classes"][name]["names"] if n not in have]
    if missing:
        have |= set(dir(sample()))
    return [n for n in missing if n not in have]


def report() -> tuple[int, int, list[tuple[str, int, int, list[str], list[str]]]]:
    """``(present, listed, rows)``, a row ``(what, present, listed, missing, excused)``.
    An excused name is not present: it counts against the 95 %."""
    rows = []
    for kind, entries, missing_of in (
        ("modules", CENSUS["modules"], module_missing),
        ("classes", CENSUS["classes"], class_missing),
    ):
        for what in entries:
            listed = entries[what] if kind == "modules" else entries[what]["names"]
            excused = EXCLUDED[kind].get(what, {})
            absent = missing_of(what)
            missing = [n for n in absent if n not in excused]
            rows.append((what, len(listed) - len(absent), len(listed), missing, sorted(excused)))
    present = sum(r[1] for r in rows)
    listed = sum(r[2] for r in rows)
    return present, listed, rows


def test_every_exclusion_names_a_listed_name_and_gives_a_reason() -> None:
    for kind in ("modules", "classes"):
        for what, names in EXCLUDED[kind].items():
            listed = CENSUS[kind][what] if kind == "modules" else CENSUS[kind][what]["names"]
            for name, reason in names.items():
                assert name in listed, f"{what}.{name} is excluded but not in the census"
                assert len(reason.split()) >= 4, f"{what}.{name}: give a reason"


@pytest.mark.parametrize("what", sorted(CENSUS["modules"]))
def test_module_names_present(what: str) -> None:
    excused = EXCLUDED["modules"].get(what, {})
    missing = [n for n in module_missing(what) if n not in excused]
    assert not missing, f"{shim_module(what)} lacks Celery's {missing}"


@pytest.mark.parametrize("what", sorted(CENSUS["classes"]))
def test_class_names_present(what: str) -> None:
    excused = EXCLUDED["classes"].get(what, {})
    missing = [n for n in class_missing(what) if n not in excused]
    assert not missing, f"{CLASSES[what][0]} lacks Celery's {missing}"


def test_at_least_95_percent_present() -> None:
    present, listed, rows = report()
    lacking = {what: missing for what, _, _, missing, _ in rows if missing}
    assert present / listed >= TARGET, f"{present} of {listed} present; missing: {lacking}"


def test_excused_names_that_exist_are_not_excused() -> None:
    # an exclusion whose name the shim has grown is stale: drop it from the list
    for kind, missing_of in (("modules", module_missing), ("classes", class_missing)):
        for what, names in EXCLUDED[kind].items():
            absent = set(missing_of(what))
            stale = [n for n in names if n not in absent]
            assert not stale, f"{what}: {stale} are present, drop their exclusions"


if __name__ == "__main__":
    present, listed, rows = report()
    for what, have, of, missing, excused in rows:
        line = f"{what:32} {have:3}/{of:<3}"
        if excused:
            line += f" ({len(excused)} excused)"
        if missing:
            line += f" missing: {' '.join(missing)}"
        print(line)
    print(f"census: {present} of {listed} public names present ({present / listed:.1%})")
    sys.exit(0 if present / listed >= TARGET else 1)
