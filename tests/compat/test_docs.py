"""The snippets of docs/coming-from-celery.md run (eagerly, on the sample project)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Celery
from pyrula_compat.beat import schedules_of

DOC = Path(__file__).resolve().parents[2] / "docs" / "coming-from-celery.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def snippets() -> list[str]:
    text = DOC.read_text()
    section = text.split("### Snippets", 1)[1].split("## What the shim does", 1)[0]
    return BLOCK.findall(section)


@pytest.mark.parametrize("index", range(5))
def test_snippet_runs(index: int) -> None:
    import proj.tasks as t

    code = snippets()[index]
    app = Celery("docs", broker="memory://", set_as_current=False)
    namespace: dict[str, Any] = {"add": t.add, "mul": t.mul, "tsum": t.tsum, "app": app}
    previous = (t.add.app.conf.task_always_eager, t.add.app.conf.task_eager_propagates)
    t.add.app.conf.task_always_eager = True
    try:
        exec(compile(code, f"{DOC.name}[{index}]", "exec"), namespace)
    finally:
        t.add.app.conf.task_always_eager, t.add.app.conf.task_eager_propagates = previous
    if "beat_schedule" in code:
        ids = {s.schedule_id for s in schedules_of(app)}
        assert ids == {"digest", "first-monday", "poll"}


def test_there_are_five_snippets() -> None:
    assert len(snippets()) == 5
