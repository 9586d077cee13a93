"""Stamping (``Signature.stamp``, ``StampingVisitor``): the stamps a signature, its
links, a chain, a group and a chord get, and the visitor's calls, are Celery 5.7's
(``stamps_probe.py`` runs under both)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pyrula_compat import Celery
from pyrula_compat.canvas import StampingVisitor
from tests.compat.real_celery import differences_from_celery
from tests.compat.stamps_probe import probe

HERE = Path(__file__).resolve().parent


def test_stamps_are_celerys() -> None:
    assert differences_from_celery(HERE / "stamps_probe.py", probe) == {}


def test_stamps_stated() -> None:
    app = Celery("stamps", broker="memory://", set_as_current=False)
    app.conf.task_always_eager = True

    @app.task(name="st.echo")
    def echo(x: int) -> int:
        return x

    sig = echo.s(1)
    assert sig.stamp(team="a") is sig
    assert sig.options == {"team": "a", "stamped_headers": ["team"]}
    sig.stamp(append_stamps=True, team="b")
    assert sig.options["team"] == ["b", "a"]  # the new stamp first, as on Celery
    assert sig.apply_async().get() == 1  # a stamped signature still runs


def test_a_visitor_must_say_what_to_stamp_on_a_signature() -> None:
    class Empty(StampingVisitor):
        pass

    with pytest.raises(TypeError, match="on_signature"):
        Empty()  # type: ignore[abstract]

    class Tags(StampingVisitor):
        def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
            return {"tag": sig.name}

    app = Celery("stamps", broker="memory://", set_as_current=False)
    sig = app.signature("st.any")
    sig.stamp(Tags())
    assert sig.options == {"tag": "st.any", "stamped_headers": ["tag"]}
