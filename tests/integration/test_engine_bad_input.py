"""Bad input fails in the caller with a specific error, and nothing is stored."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest

from pyrula.workflows import (
    DurableInvocationError,
    InvalidParams,
    NotJSONSerializable,
    PayloadTooLarge,
    RetryPolicy,
    StepContext,
    Store,
    UnknownWorkflow,
    WorkflowClient,
    WorkflowContext,
    step,
    workflow,
)
from pyrula.workflows.registry import Registry
from tests.conftest import StartWorker


def _client(store: Store, registry: Registry, **kwargs: Any) -> WorkflowClient:
    @workflow(registry=registry)
    async def takes_items(ctx: WorkflowContext, items: list[Any], note: str = "") -> int:
        return len(items)

    return WorkflowClient(store, registry=registry, **kwargs)


@pytest.mark.parametrize(
    "bad",
    [{1, 2}, object(), math.nan, math.inf, -math.inf, {3: "int key"}],
    ids=["set", "object", "nan", "inf", "-inf", "int-key"],
)
async def test_non_json_params_name_their_path(
    engine_store: Store, registry: Registry, bad: object
) -> None:
    client = _client(engine_store, registry)
    with pytest.raises(NotJSONSerializable) as caught:
        await client.submit("takes_items", {"items": [1, "two", bad]})
    assert caught.value.path == "params['items'][2]"
    assert "params['items'][2]" in str(caught.value)
    assert await engine_store.list_runs() == []


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({}, "items"),  # missing
        ({"items": [], "colour": "red"}, "colour"),  # extra
        ({"items": [], "ctx": 1}, "ctx"),  # the context is not a param
        # both at once: every wrong name said, not only Python's first complaint
        ({"colour": "red"}, r"'items' \(and it takes no 'colour': its params are items, note\)"),
    ],
    ids=["missing", "extra", "ctx", "missing-and-extra"],
)
async def test_params_that_do_not_fit_the_signature(
    engine_store: Store, registry: Registry, params: dict[str, Any], match: str
) -> None:
    client = _client(engine_store, registry)
    with pytest.raises(InvalidParams, match=match):
        await client.submit("takes_items", params)
    assert await engine_store.list_runs() == []


async def test_params_must_be_a_mapping(engine_store: Store, registry: Registry) -> None:
    client = _client(engine_store, registry)
    with pytest.raises(InvalidParams, match="mapping"):
        await client.submit("takes_items", [1, 2])  # type: ignore[arg-type]
    assert await engine_store.list_runs() == []


async def test_an_unknown_workflow_is_refused(engine_store: Store, registry: Registry) -> None:
    client = _client(engine_store, registry)
    with pytest.raises(UnknownWorkflow, match="takes_items"):  # names the registered ones
        await client.submit("no_such_workflow", {})
    assert await engine_store.list_runs() == []


@pytest.mark.parametrize(
    "timing",
    [
        {"delay": -1},
        {"delay": math.nan},
        {"delay": math.inf},
        {"delay": timedelta(seconds=-5)},
        {"delay": "5"},
        {"start_at": datetime(2030, 1, 1, 12, 0)},  # naive
        {"start_at": math.nan},
        {"expires_at": "x"},
        {"expires_at": datetime(2030, 1, 1, 12, 0)},
    ],
    ids=[
        "negative",
        "nan",
        "inf",
        "negative-timedelta",
        "str",
        "naive-datetime",
        "nan-start",
        "str-expiry",
        "naive-expiry",
    ],
)
async def test_bad_delays_and_start_times(
    engine_store: Store, registry: Registry, timing: dict[str, Any]
) -> None:
    client = _client(engine_store, registry)
    with pytest.raises(InvalidParams) as caught:
        await client.submit("takes_items", {"items": []}, **timing)
    assert next(iter(timing)) in str(caught.value)  # the message names the argument
    assert await engine_store.list_runs() == []


@pytest.mark.parametrize("key", ["", 42])
async def test_a_bad_idempotency_key(engine_store: Store, registry: Registry, key: Any) -> None:
    client = _client(engine_store, registry)
    with pytest.raises(InvalidParams, match="idempotency_key"):
        await client.submit("takes_items", {"items": []}, idempotency_key=key)
    assert await engine_store.list_runs() == []


async def test_params_over_the_payload_limit(engine_store: Store, registry: Registry) -> None:
    client = _client(engine_store, registry, max_payload_bytes=1000)
    with pytest.raises(PayloadTooLarge, match="1000"):
        await client.submit("takes_items", {"items": ["x" * 1000]})
    with pytest.raises(PayloadTooLarge):  # counted in bytes, not characters
        await client.submit("takes_items", {"items": ["é" * 600]})
    assert await engine_store.list_runs() == []
    assert await (await client.submit("takes_items", {"items": ["x" * 900]})).status()


async def test_a_step_result_that_is_not_json_fails_the_run_without_retrying(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    calls: list[int] = []

    @step(retry=RetryPolicy(max_attempts=3, initial_backoff=0.01))
    def makes_a_set(ctx: StepContext) -> set[int]:
        calls.append(ctx.attempt)  # its side effect happened: it must not be repeated
        return {1, 2}

    @workflow(registry=registry)
    async def unstorable(ctx: WorkflowContext) -> Any:
        return await makes_a_set()

    await start_worker(engine_store, [unstorable])
    handle = await WorkflowClient(engine_store, registry=registry).submit("unstorable")
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == "pyrula.workflows.errors.NotJSONSerializable"
    assert "result of step 'makes_a_set'" in failed.value.error_message
    assert isinstance(failed.value.original, NotJSONSerializable)
    assert calls == [1]
    [entry] = await engine_store.load_journal(handle.run_id)
    assert not entry.ok


async def test_a_workflow_result_that_is_not_json_or_too_large_fails_the_run(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def returns(ctx: WorkflowContext, kind: str) -> Any:
        return {"nan": math.nan, "big": "x" * 2000}[kind]

    await start_worker(engine_store, [returns], max_payload_bytes=1000)
    client = WorkflowClient(engine_store, registry=registry)
    nan_run = await client.submit("returns", {"kind": "nan"})
    with pytest.raises(DurableInvocationError) as failed:
        await nan_run.result(timeout=10)
    assert failed.value.error_type == "pyrula.workflows.errors.NotJSONSerializable"
    assert "workflow result" in failed.value.error_message
    big_run = await client.submit("returns", {"kind": "big"})
    with pytest.raises(DurableInvocationError) as too_big:
        await big_run.result(timeout=10)
    assert too_big.value.error_type == "pyrula.workflows.errors.PayloadTooLarge"


async def test_params_checked_by_the_worker_when_the_client_did_not(
    engine_store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    @workflow(registry=registry)
    async def strict(ctx: WorkflowContext, n: int) -> int:
        return n

    # A client that submits by name only (the worker's process knows the workflow).
    by_name = WorkflowClient(engine_store, registry=Registry(), require_registered=False)
    handle = await by_name.submit("strict", {"m": 1})
    await start_worker(engine_store, [strict])
    with pytest.raises(DurableInvocationError) as failed:
        await handle.result(timeout=10)
    assert failed.value.error_type == "pyrula.workflows.errors.InvalidParams"
