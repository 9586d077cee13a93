"""Batch triggers: events go into a durable buffer; one run takes them a batch at a time.

    python examples/batch_triggers.py

1. Define a workflow that takes a batch (``events``) and a trigger that starts it with up
   to 50 events, or with what is there once the oldest has waited 0.5 s.
2. Two real workers on one SQLite file fire the batches; a client sends 230 events from
   several threads (the blocking client) and one more later, which goes after 0.5 s.
3. Every event is in exactly one run, in the order each sender sent them, and no batch
   holds more than 50.
See docs/triggers.md.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any

from pyrula.workflows import (
    RunStatus,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    batch_trigger,
    open_store,
    workflow,
)
from pyrula.workflows.sync import WorkflowClient


@workflow(name="index_documents")
async def index_documents(ctx: WorkflowContext, events: list[dict[str, Any]]) -> int:
    # One step for the whole batch: a bulk write costs about what one write does.
    return await ctx.step("bulk_index", lambda: len(events))  # type: ignore[no-any-return]


batch_trigger("documents", index_documents, max_size=50, max_wait=0.5)


def send(url: str, sender: int, count: int) -> None:
    with WorkflowClient(open_store(url)) as client:
        for start in range(0, count, 7):  # a few events per call, as a web app would
            chunk = range(start, min(start + 7, count))
            client.send_events("documents", [{"sender": sender, "n": n} for n in chunk])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/pyrula.db"
        options = WorkerOptions(claim_poll_interval=0.05, trigger_poll_interval=0.05)
        workers = [WorkflowWorker(open_store(url), options=options) for _ in range(2)]
        threads = [threading.Thread(target=lambda w=w: asyncio.run(w.run())) for w in workers]
        for thread in threads:
            thread.start()
        try:
            senders = [threading.Thread(target=send, args=(url, s, 46)) for s in range(5)]
            for thread in senders:
                thread.start()
            for thread in senders:
                thread.join()
            time.sleep(1.0)
            send(url, 99, 1)  # one event alone: it waits max_wait, then runs by itself
            runs = wait_for(url, 231)
        finally:
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join()

    sizes = [len(json.loads(run.params)["events"]) for run in runs]
    by_sender: dict[int, list[int]] = defaultdict(list)
    for run in runs:
        for event in json.loads(run.params)["events"]:
            by_sender[event["sender"]].append(event["n"])
    assert all(run.status is RunStatus.COMPLETED for run in runs)
    assert max(sizes) <= 50 and sum(sizes) == 231
    assert all(got == list(range(len(got))) for got in by_sender.values())  # each once, in order
    assert sizes[-1] == 1  # the late event went alone, after its wait
    print(f"{sum(sizes)} events in {len(runs)} runs of at most 50: {sizes}")
    print("every event once, in each sender's order")


def wait_for(url: str, events: int) -> list[Any]:
    """The completed runs of index_documents, oldest first, once they hold ``events``."""
    store = open_store(url)
    try:
        deadline = time.monotonic() + 30
        while True:
            runs = asyncio.run(store.list_runs(workflow="index_documents", limit=1000))
            done = [r for r in runs if r.status is RunStatus.COMPLETED]
            held = sum(len(json.loads(r.params)["events"]) for r in done)
            if held >= events and len(done) == len(runs):
                return sorted(reversed(runs), key=lambda r: r.created_at)
            if time.monotonic() > deadline:
                raise AssertionError(f"{held} of {events} events ran within 30 s")
            time.sleep(0.05)
    finally:
        asyncio.run(store.close())


if __name__ == "__main__":
    main()
