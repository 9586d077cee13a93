"""Retrying a parent that failed because a child run failed runs the child again.

``handle.retry()`` (and the blocking handle's, and ``pyrula runs retry``) retries the
failed child first, recursively, then the parent: the child's failed step runs again and
the parent continues from the child's new outcome. Finished steps of both replay. Every
test runs on a MemoryStore, a SqliteStore file, a single Valkey node and a Valkey
cluster, with a real worker on the real clock.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import (
    DurableInvocationError,
    MemoryStore,
    RunCancelled,
    RunStatus,
    SqliteStore,
    Store,
    WorkflowClient,
    WorkflowContext,
    workflow,
)
from pyrula.workflows.registry import Registry
from pyrula.workflows.retry import NO_RETRY
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.sync import WorkflowClient as SyncClient
from tests.conftest import Eventually, StartWorker
from tests.valkey.servers import fresh_namespace, valkey_cluster, valkey_server  # noqa: F401

WAIT = 20.0

Workflows = tuple[Any, ...]


@pytest.fixture(params=["memory", "sqlite", "valkey", "valkey-cluster"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    kind: str = request.param
    built: Store
    if kind == "memory":
        built = MemoryStore()
    elif kind == "sqlite":
        built = SqliteStore(tmp_path / "retry.db")
    elif kind == "valkey":
        url = request.getfixturevalue("valkey_server").url
        built = ValkeyStore(url, namespace=fresh_namespace(), shard_count=4)
    else:
        url = request.getfixturevalue("valkey_cluster").url
        built = ValkeyStore(url, namespace=fresh_namespace(), shard_count=4, cluster=True)
    await built.open()
    try:
        yield built
    finally:
        await built.close()


class Flaky:
    """Counts each step's executions; ``fail`` names the steps that raise while set."""

    def __init__(self, *failing: str) -> None:
        self.calls: Counter[str] = Counter()
        self.failing = set(failing)

    def step(self, ctx: WorkflowContext, name: str) -> Awaitable[Any]:
        def body() -> str:
            self.calls[name] += 1
            if name in self.failing:
                raise ConnectionError(f"{name} is down")
            return name

        return ctx.step(name, body, retry=NO_RETRY)


def family(registry: Registry, flaky: Flaky) -> Workflows:
    """``parent`` -> ``kid`` (whose step ``kid_flaky`` may fail); ``grandparent`` ->
    ``parent``; ``fan_out`` gathers three ``kid`` runs, of which ``kid_flaky_2`` fails."""

    @workflow(registry=registry)
    async def kid(ctx: WorkflowContext, n: int) -> str:
        first = await flaky.step(ctx, f"kid_first_{n}")
        middle = await flaky.step(ctx, f"kid_flaky_{n}")
        return f"{first}+{middle}"

    @workflow(registry=registry)
    async def parent(ctx: WorkflowContext) -> list[str]:
        before = await flaky.step(ctx, "parent_before")
        child = await ctx.run_child(kid, {"n": 1})
        after = await flaky.step(ctx, "parent_after")
        return [before, child, after]

    @workflow(registry=registry)
    async def grandparent(ctx: WorkflowContext) -> Any:
        await flaky.step(ctx, "grandparent_before")
        return await ctx.run_child(parent)

    @workflow(registry=registry)
    async def fan_out(ctx: WorkflowContext) -> list[Any]:
        results = await ctx.gather(*(ctx.run_child(kid, {"n": n}) for n in (1, 2, 3)))
        await flaky.step(ctx, "fan_out_after")
        return results

    return kid, parent, grandparent, fan_out


async def _fails(handle: Any) -> DurableInvocationError:
    with pytest.raises(DurableInvocationError) as caught:
        await handle.result(timeout=WAIT)
    return caught.value


async def _kids(store: Store, status: RunStatus | None = None) -> list[str]:
    return sorted(r.run_id for r in await store.list_runs(workflow="kid", status=status))


async def test_retrying_the_parent_reruns_its_failed_child_and_continues(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    flaky = Flaky("kid_flaky_1")
    workflows = family(registry, flaky)
    await start_worker(store, workflows)
    handle = await WorkflowClient(store, registry=registry).submit("parent")
    failure = await _fails(handle)
    assert "kid_flaky_1 is down" in failure.error_message
    [kid_id] = await _kids(store, RunStatus.FAILED)
    assert flaky.calls == {"parent_before": 1, "kid_first_1": 1, "kid_flaky_1": 1}
    failed = await handle.record()
    assert failed.failed_position == 2  # the child's outcome, journaled as an error

    flaky.failing.clear()
    assert (await handle.retry()).status is RunStatus.QUEUED
    assert await handle.result(timeout=WAIT) == [
        "parent_before",
        "kid_first_1+kid_flaky_1",
        "parent_after",
    ]
    # The child ran again (its failed step only); finished steps of both replayed.
    assert flaky.calls == {
        "parent_before": 1,
        "kid_first_1": 1,
        "kid_flaky_1": 2,
        "parent_after": 1,
    }
    assert await _kids(store, RunStatus.COMPLETED) == [kid_id]  # the same child, not a new one
    journal = await store.load_journal(handle.run_id)
    assert [(e.kind, e.ok) for e in journal] == [
        ("step", True),
        ("child", True),
        ("child_result", True),
        ("step", True),
    ]


async def test_a_failed_grandchild_runs_again_when_the_grandparent_is_retried(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    flaky = Flaky("kid_flaky_1")
    workflows = family(registry, flaky)
    await start_worker(store, workflows)
    handle = await WorkflowClient(store, registry=registry).submit("grandparent")
    await _fails(handle)
    [middle] = await store.list_runs(workflow="parent")
    assert middle.status is RunStatus.FAILED and middle.parent_run_id == handle.run_id

    flaky.failing.clear()
    await handle.retry()
    assert await handle.result(timeout=WAIT) == [
        "parent_before",
        "kid_first_1+kid_flaky_1",
        "parent_after",
    ]
    assert flaky.calls == {
        "grandparent_before": 1,
        "parent_before": 1,
        "kid_first_1": 1,
        "kid_flaky_1": 2,
        "parent_after": 1,
    }
    assert len(await store.list_runs(workflow="parent")) == 1
    assert len(await _kids(store, RunStatus.COMPLETED)) == 1


async def test_in_a_gather_only_the_failed_child_runs_again(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    flaky = Flaky("kid_flaky_2")
    workflows = family(registry, flaky)
    await start_worker(store, workflows)
    handle = await WorkflowClient(store, registry=registry).submit("fan_out")
    await _fails(handle)
    assert len(await _kids(store, RunStatus.COMPLETED)) == 2
    assert len(await _kids(store, RunStatus.FAILED)) == 1

    flaky.failing.clear()
    await handle.retry()
    assert await handle.result(timeout=WAIT) == [
        "kid_first_1+kid_flaky_1",
        "kid_first_2+kid_flaky_2",
        "kid_first_3+kid_flaky_3",
    ]
    assert flaky.calls == {
        "kid_first_1": 1,
        "kid_flaky_1": 1,
        "kid_first_2": 1,
        "kid_flaky_2": 2,
        "kid_first_3": 1,
        "kid_flaky_3": 1,
        "fan_out_after": 1,
    }
    assert len(await _kids(store, RunStatus.COMPLETED)) == 3


async def test_several_failed_children_of_a_gather_run_again_one_retry_each(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """The parent raised the first failure in argument order; each retry of it runs
    that failed child again, then meets the next recorded failure."""
    flaky = Flaky("kid_flaky_1", "kid_flaky_3")
    await start_worker(store, family(registry, flaky))
    handle = await WorkflowClient(store, registry=registry).submit("fan_out")
    assert "kid_flaky_1 is down" in (await _fails(handle)).error_message
    flaky.failing.clear()
    await handle.retry()
    assert "kid_flaky_3 is down" in (await _fails(handle)).error_message
    await handle.retry()
    assert len(await handle.result(timeout=WAIT)) == 3
    assert flaky.calls == {
        "kid_first_1": 1,
        "kid_flaky_1": 2,
        "kid_first_2": 1,
        "kid_flaky_2": 1,
        "kid_first_3": 1,
        "kid_flaky_3": 2,
        "fan_out_after": 1,
    }


async def test_a_child_retried_on_its_own_lets_the_parent_retry_go_on(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    flaky = Flaky("kid_flaky_1")
    await start_worker(store, family(registry, flaky))
    client = WorkflowClient(store, registry=registry)
    handle = await client.submit("parent")
    await _fails(handle)
    [kid_id] = await _kids(store, RunStatus.FAILED)
    flaky.failing.clear()
    kid = client.handle("kid", kid_id)
    await kid.retry()
    assert await kid.result(timeout=WAIT) == "kid_first_1+kid_flaky_1"
    assert (await handle.record()).status is RunStatus.FAILED  # the parent waits for its retry
    await handle.retry()
    assert (await handle.result(timeout=WAIT))[1] == "kid_first_1+kid_flaky_1"
    assert flaky.calls["kid_flaky_1"] == 2 and flaky.calls["parent_before"] == 1


async def test_a_child_failure_the_parent_handled_is_not_rerun(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    """The parent caught the child's error and failed later, at a step of its own: the
    retry runs that step again, and the handled child stays as it ended (a replay must
    take the branch the first run took)."""
    flaky = Flaky("kid_flaky_1", "parent_late")

    @workflow(registry=registry)
    async def kid(ctx: WorkflowContext, n: int) -> str:
        return str(await flaky.step(ctx, f"kid_flaky_{n}"))

    @workflow(registry=registry)
    async def careful(ctx: WorkflowContext) -> list[str]:
        try:
            got = await ctx.run_child(kid, {"n": 1})
        except DurableInvocationError:
            got = "fallback"
        return [got, await flaky.step(ctx, "parent_late")]

    await start_worker(store, [kid, careful])
    handle = await WorkflowClient(store, registry=registry).submit(careful)
    await _fails(handle)
    flaky.failing.clear()
    await handle.retry()
    assert await handle.result(timeout=WAIT) == ["fallback", "parent_late"]
    assert flaky.calls == {"kid_flaky_1": 1, "parent_late": 2}
    assert len(await _kids(store, RunStatus.FAILED)) == 1


async def test_the_blocking_handle_retries_the_child_too(
    store: Store, registry: Registry, start_worker: StartWorker
) -> None:
    flaky = Flaky("kid_flaky_1")
    await start_worker(store, family(registry, flaky))
    client = SyncClient(store, registry=registry)

    def submit_and_fail() -> str:
        handle = client.submit("parent")
        with pytest.raises(DurableInvocationError):
            handle.result(timeout=WAIT)
        return handle.run_id

    def retry(run_id: str) -> Any:
        handle = client.handle("parent", run_id)
        assert handle.retry().status is RunStatus.QUEUED
        return handle.result(timeout=WAIT)

    run_id = await asyncio.to_thread(submit_and_fail)
    flaky.failing.clear()
    assert await asyncio.to_thread(retry, run_id) == [
        "parent_before",
        "kid_first_1+kid_flaky_1",
        "parent_after",
    ]
    assert flaky.calls["kid_flaky_1"] == 2 and flaky.calls["kid_first_1"] == 1


async def test_a_cancelled_parent_retried_reruns_the_children_its_cancel_stopped(
    store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    """Cancelling a parent that waits on two gathered children cancels them too; the
    parent's retry retries both, and each goes on from its journal."""
    calls: Counter[str] = Counter()

    def count(name: str) -> str:
        calls[name] += 1
        return name

    @workflow(registry=registry)
    async def held(ctx: WorkflowContext, n: int) -> str:
        first = await ctx.step("first", count, f"first_{n}")
        go = await ctx.wait_for_signal("go")
        return f"{first}:{go}:{await ctx.step('next', count, f'next_{n}')}"

    @workflow(registry=registry)
    async def pair(ctx: WorkflowContext) -> list[str]:
        return await ctx.gather(ctx.run_child(held, {"n": 1}), ctx.run_child(held, {"n": 2}))

    await start_worker(store, [held, pair])
    handle = await WorkflowClient(store, registry=registry).submit(pair)

    async def all_waiting() -> bool:
        runs = await store.list_runs(workflow="held", status=RunStatus.WAITING)
        return len(runs) == 2 and await handle.status() is RunStatus.WAITING

    await eventually(all_waiting, timeout=WAIT, what="the parent and both children waiting")
    await handle.cancel()
    with pytest.raises(RunCancelled):
        await handle.result(timeout=WAIT)
    kids = await store.list_runs(workflow="held")
    assert {kid.status for kid in kids} == {RunStatus.CANCELLED}

    await handle.retry()
    for kid in kids:
        assert (await store.get_run(kid.run_id)).status is not RunStatus.CANCELLED  # type: ignore[union-attr]
        await store.send_signal(kid.run_id, "go", '"ok"')
    assert await handle.result(timeout=WAIT) == ["first_1:ok:next_1", "first_2:ok:next_2"]
    assert calls == {"first_1": 1, "first_2": 1, "next_1": 1, "next_2": 1}


async def test_a_parent_cancelled_while_running_beside_its_child_retries_the_child(
    store: Store, registry: Registry, start_worker: StartWorker, eventually: Eventually
) -> None:
    """The parent runs a gathered step when it is cancelled, and its waiting child is
    cancelled at once. The parent does not journal the child's end that its own cancel
    caused, so its retry retries the child, and the finished step replays."""
    entered, release = asyncio.Event(), asyncio.Event()
    calls: Counter[str] = Counter()

    async def hold() -> str:
        calls["hold"] += 1
        entered.set()
        await release.wait()
        return "held"

    @workflow(registry=registry)
    async def listener(ctx: WorkflowContext) -> Any:
        return await ctx.wait_for_signal("go")

    @workflow(registry=registry)
    async def beside(ctx: WorkflowContext) -> list[Any]:
        return await ctx.gather(ctx.run_child(listener), ctx.step("hold", hold))

    await start_worker(store, [listener, beside])
    handle = await WorkflowClient(store, registry=registry).submit(beside)
    await asyncio.wait_for(entered.wait(), WAIT)

    async def child_waiting() -> bool:
        return len(await store.list_runs(workflow="listener", status=RunStatus.WAITING)) == 1

    await eventually(child_waiting, timeout=WAIT, what="the child waiting for its signal")
    await handle.cancel()
    release.set()
    with pytest.raises(RunCancelled):
        await handle.result(timeout=WAIT)
    journal = await store.load_journal(handle.run_id)
    assert [e.kind for e in journal] == ["child", "step"]  # no child_result

    await handle.retry()
    [kid] = await store.list_runs(workflow="listener")
    await store.send_signal(kid.run_id, "go", '"now"')
    assert await handle.result(timeout=WAIT) == ["now", "held"]
    assert calls == {"hold": 1}


async def test_pyrula_runs_retry_reruns_the_failed_child(
    registry: Registry, start_worker: StartWorker, tmp_path: Path
) -> None:
    path = tmp_path / "cli.db"
    store = SqliteStore(path)
    await store.open()
    try:
        flaky = Flaky("kid_flaky_1")
        await start_worker(store, family(registry, flaky))
        handle = await WorkflowClient(store, registry=registry).submit("parent")
        await _fails(handle)

        def cli_json(*args: str) -> Any:
            result = CliRunner().invoke(cli, [*args, "--store", f"sqlite:///{path}", "--json"])
            assert result.exit_code == 0, result.output
            return json.loads(result.stdout)

        shown = await asyncio.to_thread(cli_json, "runs", "show", handle.run_id)
        outcome = shown["journal"][2]
        assert (outcome["kind"], outcome["ok"], outcome["error"]) == ("child_result", False, None)
        assert outcome["value"]["status"] == "failed"

        flaky.failing.clear()
        retried = await asyncio.to_thread(cli_json, "runs", "retry", handle.run_id)
        assert retried["run"]["status"] == "queued"
        assert (await handle.result(timeout=WAIT))[1] == "kid_first_1+kid_flaky_1"
        assert flaky.calls["kid_flaky_1"] == 2 and flaky.calls["parent_before"] == 1
    finally:
        await store.close()
