"""Valkey for live runs, Postgres for ended ones: the page docs/archive.md in one file.

Run it from the repository root against a local Valkey and Postgres::

    pip install 'pyrula[postgres]'
    export PYRULA_POSTGRES_DSN=postgresql://postgres@localhost:5432/postgres
    pyrula db migrate --postgres-dsn "$PYRULA_POSTGRES_DSN"
    pyrula db check --valkey-url redis://localhost:6379 --postgres-dsn "$PYRULA_POSTGRES_DSN"
    python -m examples.archive_worker --valkey-url redis://localhost:6379

(``--postgres-dsn`` may be given instead of the variable.) No Postgres at hand?
``pip install pgserver``, then this starts a private one and prints its DSN. Without
``cleanup_mode=None`` the server would stop when that Python exits::

    python -c "import pgserver; print(pgserver.get_server('/tmp/pg', cleanup_mode=None).get_uri())"

and this stops it when you are done::

    python -c "import pgserver; pgserver.get_server('/tmp/pg').cleanup()"

What it does: starts a worker on ``ArchivingStore(ValkeyStore, PostgresArchive)`` with a
short ``live_ttl_after_archive`` (2 s, for the demo; the default is 300), submits three
runs, waits until the reconcile loop has copied them to Postgres and they have expired
from Valkey, then reads them back (record, journal, result) through the same store: the
reads fall through to the archive. It stops the worker and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from pyrula.workflows import (
    ArchivingStore,
    PostgresArchive,
    ValkeyStore,
    WorkerOptions,
    WorkflowContext,
    WorkflowWorker,
    workflow,
)
from pyrula.workflows.registry import Registry

registry = Registry()


@workflow(name="archive_demo", registry=registry)
async def archive_demo(ctx: WorkflowContext, n: int) -> int:
    squared = await ctx.step("square", lambda: n * n)
    return int(await ctx.step("plus_one", lambda: squared + 1))


async def main(
    valkey_url: str, dsn: str, *, namespace: str = "archive-demo", ttl: float = 2.0
) -> None:
    store = ArchivingStore(
        live=ValkeyStore(url=valkey_url, namespace=namespace),
        archive=PostgresArchive(dsn=dsn),
        live_ttl_after_archive=ttl,
        reconcile_interval=0.5,
        clock_skew=0.5,
    )
    worker = WorkflowWorker(
        store=store, workflows=[archive_demo], options=WorkerOptions(), registry=registry
    )
    serving = asyncio.create_task(worker.run())  # opens the store: checks the schema
    try:
        handles = [await worker.client.submit("archive_demo", {"n": n}) for n in range(3)]
        print("results:", [await h.result(timeout=30) for h in handles])
        deadline = time.monotonic() + 60
        while any([await store.live.get_run(h.run_id) for h in handles]):
            if serving.done() or time.monotonic() > deadline:
                raise SystemExit("the runs did not leave Valkey; is the archive reachable?")
            await asyncio.sleep(0.2)
        print(f"archived to {store.archive.url} and expired from {store.live.url}")
        for handle in handles:
            run = await store.get_run(handle.run_id)  # from Postgres now
            journal = await store.load_journal(handle.run_id)
            assert run is not None
            print(
                f"  {run.run_id}: {run.status.value}, result {run.result}, "
                f"steps {[entry.name for entry in journal]}, "
                f"result via the client {await handle.result(timeout=1)}"
            )
    finally:
        worker.stop()
        await serving
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--valkey-url", default="redis://localhost:6379")
    parser.add_argument("--postgres-dsn", default=os.environ.get("PYRULA_POSTGRES_DSN"))
    args = parser.parse_args()
    if not args.postgres_dsn:
        parser.error("give --postgres-dsn or set PYRULA_POSTGRES_DSN")
    asyncio.run(main(args.valkey_url, args.postgres_dsn))
