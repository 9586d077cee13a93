"""``WorkflowClient.new_run``: the run ``submit`` stores, checked the same way every
time, although a set of param names that fitted is bound only once."""

from __future__ import annotations

import pytest

from pyrula.workflows import MemoryStore, WorkflowClient, WorkflowContext, workflow
from pyrula.workflows.errors import InvalidParams
from pyrula.workflows.rate import Rate
from pyrula.workflows.registry import Registry


def test_params_are_checked_on_every_call() -> None:
    registry = Registry()

    @workflow(registry=registry, name="pair", rate_limit=Rate(per_second=5, key="k:{a}"))
    async def pair(ctx: WorkflowContext, a: int, b: int = 0) -> int:
        return a + b

    client = WorkflowClient(MemoryStore(), registry=registry)
    for i in range(3):  # the same names again, after they were remembered
        new = client.new_run("pair", {"a": i, "b": 1}, run_id=f"r{i}")
        assert (new.run_id, new.workflow, new.params) == (f"r{i}", "pair", f'{{"a":{i},"b":1}}')
        assert new.flow.rate_key == f"k:{i}"
        assert client.new_run("pair", {"a": i}).params == f'{{"a":{i}}}'
        with pytest.raises(InvalidParams):
            client.new_run("pair", {"b": 1})
        with pytest.raises(InvalidParams):
            client.new_run("pair", {"a": 1, "c": 2})
    with pytest.raises(InvalidParams):
        client.new_run("pair", {"a": 1}, idempotency_key="")
