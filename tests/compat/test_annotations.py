"""``task_annotations`` (no worker, no server): set on tasks when they are registered."""

from __future__ import annotations

from typing import Any

from pyrula_compat import Celery


class SlowDown:
    """Celery's object form: ``annotate(task)`` for one task, ``annotate_any()`` for all."""

    def annotate(self, task: Any) -> dict[str, Any] | None:
        return {"rate_limit": "1/s"} if task.name.endswith(".mul") else None

    def annotate_any(self) -> dict[str, Any]:
        return {"delivery_mode": "transient"}


def make_app(annotations: Any) -> Celery:
    app = Celery("anno", broker="memory://", set_as_current=False)
    app.conf.task_annotations = annotations
    return app


def test_a_dict_by_name_and_for_every_task() -> None:
    app = make_app({"anno.add": {"rate_limit": "10/s", "max_retries": 7}, "*": {"acks_late": True}})

    @app.task(name="anno.add", max_retries=2)
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="anno.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    assert (add.rate_limit, add.max_retries, add.acks_late) == ("10/s", 7, True)  # over options
    assert (mul.rate_limit, mul.max_retries, mul.acks_late) == (None, 3, True)
    # The annotated rate is the one the worker enforces (the task's workflow).
    assert app.registry.get("anno.add").rate_limit is not None
    assert app.registry.get("anno.mul").rate_limit is None


def test_objects_lists_and_the_first_match_wins() -> None:
    app = make_app([SlowDown(), {"anno.mul": {"rate_limit": "99/s"}, "*": {"priority": 1}}])

    @app.task(name="anno.mul")
    def mul(x: int, y: int) -> int:
        return x * y

    assert mul.rate_limit == "1/s"  # the object came first
    assert mul.delivery_mode == "transient"  # its annotate_any came first too
    assert mul(2, 3) == 6


def test_annotations_set_after_a_task_is_registered_apply_when_the_app_finalizes() -> None:
    from pyrula_compat import shared_task

    @shared_task(name="anno.early")
    def early() -> int:  # made for every app as the app is made
        return 1

    app = Celery("anno-late", broker="memory://", set_as_current=False)
    app.conf.update(task_annotations={"*": {"rate_limit": "2/s", "max_retries": 9}})
    task = app.tasks["anno.early"]  # finalizes the app
    assert (task.max_retries, task.rate_limit) == (9, "2/s")
    assert app.registry.get("anno.early").rate_limit is not None


def test_an_attempt_the_worker_lost_before_its_body_never_runs_it() -> None:
    from pyrula_compat.app.task import Context
    from pyrula_compat.execution import run_attempt

    app = Celery("anno-stop", broker="memory://", set_as_current=False)
    ran: list[str] = []

    @app.task(name="anno.body")
    def body() -> str:
        ran.append("body")
        return "done"

    request = Context(id="run-1", args=[], kwargs={}, is_eager=False, called_directly=False)
    assert run_attempt(body, request, {"stop": True}).kind == "lost"
    assert ran == []
    assert run_attempt(body, request, {}).kind == "ok" and ran == ["body"]
