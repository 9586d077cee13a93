"""Stamps signatures and canvases the same way on Celery and on ``pyrula_compat`` and
prints the stamped options and the visitor's calls as JSON; ``test_canvas_stamps.py``
runs it under both and compares. ``python stamps_probe.py celery`` (Celery on the path)."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _options(sig: Any) -> dict[str, Any]:
    out = {}
    for key, value in sig.options.items():
        if key in ("link", "link_error"):
            value = [_options(s) | {"task": s["task"]} for s in value]
        elif key == "stamped_headers":
            value = sorted(value)
        elif isinstance(value, list):
            value = sorted(value, key=repr)
        out[key] = value
    return out


def probe(pkg: str) -> dict[str, Any]:
    celery = importlib.import_module(pkg)
    canvas = importlib.import_module(f"{pkg}.canvas")
    app = celery.Celery("stamps", broker="memory://", set_as_current=False)

    @app.task(name="st.add")
    def add(x: int = 0) -> int:
        return x

    calls: list[str] = []

    class Visitor(canvas.StampingVisitor):
        def on_signature(self, sig: Any, **headers: Any) -> dict[str, Any]:
            calls.append(f"sig {sig.args}")
            return {"on_sig": f"s{sig.args}"}

        def on_group_start(self, group: Any, **headers: Any) -> dict[str, Any]:
            calls.append("group start")
            return {"in_group": True}

        def on_group_end(self, group: Any, **headers: Any) -> None:
            calls.append("group end")

        def on_chain_start(self, chain: Any, **headers: Any) -> dict[str, Any]:
            calls.append("chain start")
            return {"in_chain": 1}

        def on_chain_end(self, chain: Any, **headers: Any) -> None:
            calls.append("chain end")

        def on_chord_body(self, sig: Any, **header: Any) -> dict[str, Any]:
            calls.append("chord body")
            return {"body": "yes"}

        def on_callback(self, callback: Any, **header: Any) -> dict[str, Any]:
            calls.append(f"callback {callback.args}")
            return {"cb": 1}

        def on_errback(self, errback: Any, **header: Any) -> dict[str, Any]:
            calls.append(f"errback {errback.args}")
            return {"eb": 2}

    plain = add.s(1)
    plain.stamp(foo="bar", n=1)
    twice = add.s(2)
    twice.stamp(x=1)
    twice.stamp(x=2)
    appended = add.s(3)
    appended.stamp(x=1)
    appended.stamp(append_stamps=True, x=2)
    linked = add.s(4)
    linked.link(add.s(40))
    linked.link_error(add.s(41))
    linked.stamp(Visitor(), tag="t")
    chained = celery.chain(add.s(5), add.s(8), celery.group(add.s(6), add.s(7)))
    chained.stamp(Visitor(), c="x")
    grouped = celery.group(add.s(9), add.s(10))
    grouped.stamp(g=1)
    chorded = celery.chord([add.s(11), add.s(12)], add.s(13))
    chorded.stamp(Visitor(), k="v")
    plain_chord = celery.chord([add.s(14)], add.s(15))
    plain_chord.stamp(k="v")
    flat = chained.tasks

    def header(c: Any) -> list[Any]:  # Celery's chord.tasks is its header group
        return list(getattr(c.tasks, "tasks", c.tasks))

    return {
        "plain": _options(plain),
        "twice": _options(twice),
        "appended": _options(appended),
        "linked": _options(linked),
        "chain_first": _options(flat[0]),
        "chain_second": _options(flat[1]),
        "chain_group": [_options(t) for t in flat[-1].tasks],
        "chain_own": _options(chained),
        "group_members": [_options(t) for t in grouped.tasks],
        "group_own": _options(grouped),
        "chord_header": [_options(t) for t in header(chorded)],
        "chord_body": _options(chorded.body),
        "plain_chord_body": _options(plain_chord.body),
        "plain_chord_header": [_options(t) for t in header(plain_chord)],
        "calls": calls,
    }


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1]), sort_keys=True, default=str))
