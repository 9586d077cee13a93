"""The worker process the SQLite benchmarks spawn: serves ``bench_three_steps``.

    python bench/serve_worker.py sqlite:///path.db [--concurrency 50]

Runs one WorkflowWorker until SIGTERM or SIGINT (graceful stop). Started and stopped by
PID from ``common.start_worker`` / ``common.stop_worker``; not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from common import bench_three_steps
from pyrula.workflows import WorkerOptions, WorkflowWorker, open_store


async def serve(url: str, concurrency: int) -> None:
    store = open_store(url)
    worker = WorkflowWorker(
        store,
        workflows=[bench_three_steps],
        options=WorkerOptions(max_concurrent_runs=concurrency),
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
    try:
        await worker.run()
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="worker: %(levelname)s %(message)s")
    asyncio.run(serve(args.url, args.concurrency))


if __name__ == "__main__":
    main()
