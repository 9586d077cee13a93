"""Builds signatures with Celery's canvas methods the same way on Celery and on
``pyrula_compat`` and prints what they give as JSON; ``test_canvas_methods.py`` runs
it under both and compares. ``python canvas_probe.py celery`` (Celery on the path)."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def probe(pkg: str) -> dict[str, Any]:
    celery = importlib.import_module(pkg)
    app = celery.Celery("probe", broker="memory://", set_as_current=False)

    @app.task(name="probe.add")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @app.task(name="probe.log")
    def log(value: Any) -> None: ...

    sig = add.s(2, y=3)
    replaced = sig.replace(args=(7,), kwargs={"y": 1}, options={"queue": "q"})
    listed = add.s(1)
    listed.append_to_list_option("link", "a")
    listed.append_to_list_option("link", "a")
    listed.options["single"] = "x"
    listed.append_to_list_option("single", "y")
    listed.extend_list_option("link", ["b", "c"])
    listed.extend_list_option("other", "d")
    linked = add.s(1)
    inner = log.s()
    inner.link(add.s(9))
    linked.link(inner)
    linked.link(log.si("done"))
    skewed = celery.group(add.s(i) for i in range(4)).skew(start=1, stop=2.5, step=0.5)
    chained = celery.chain(add.s(1), add.s(2))
    chained.link(log.s())
    chained.link_error(log.si("failed"))
    unchained = chained.unchain_tasks()
    options = add.s(1).set(parent_id="p", root_id="r")

    class custom(celery.Signature):
        pass

    celery.Signature.register_type(name="probe_custom")(custom)
    rebuilt = celery.Signature.from_dict({"task": "probe.add", "subtask_type": "probe_custom"})
    return {
        "reprcall": [sig.reprcall(), sig.reprcall(1), add.si(1).reprcall(5, z=1)],
        "replace": [
            list(replaced.args),
            replaced.kwargs,
            dict(replaced.options),
            list(sig.args),
            sig.kwargs,
        ],
        "list_options": dict(listed.options),
        "flatten_links": [s.reprcall() for s in linked.flatten_links()],
        "skew": [t.options.get("countdown") for t in skewed.tasks],
        "unchain": [
            [
                t.reprcall(),
                [str(x) for x in t.options.get("link") or []],
                [str(x) for x in t.options.get("link_error") or []],
            ]
            for t in unchained
        ],
        "ids": [options.parent_id, options.root_id, add.s(1).parent_id],
        "types": sorted(k for k in celery.Signature.TYPES if k != "probe_custom"),
        "registered": type(rebuilt).__name__,
        "async_result": add.s(1).AsyncResult("x").id,
    }


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1]), sort_keys=True, default=str))
