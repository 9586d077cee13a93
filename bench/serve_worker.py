"""The worker process the SQLite benchmarks spawn: serves ``bench_three_steps``.

    python bench/serve_worker.py sqlite:///path.db [--concurrency 50]

Runs one WorkflowWorker until SIGTERM or SIGINT (graceful stop). Started and stopped by
PID from ``common.start_worker`` / ``common.stop_worker``; not meant to be run by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from common import bench_three_steps, serve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="worker: %(levelname)s %(message)s")
    options = {"max_concurrent_runs": args.concurrency}
    asyncio.run(serve(args.url, [bench_three_steps.name], options))


if __name__ == "__main__":
    main()
