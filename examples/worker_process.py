"""A minimal production worker process.

Run it from the repository root, pointing it at the store the app submits to::

    PYRULA_STORE_URL=sqlite:////var/lib/myapp/pyrula.db python -m examples.worker_process

It serves every workflow imported into the process (here ``examples.workflows``).
SIGTERM or SIGINT stops it gracefully: no new claims, in-flight runs get
``shutdown_grace`` seconds to finish, the rest are handed back to the queue, then it
exits 0. ``pyrula worker --workflow examples.workflows`` does the same from the CLI.
"""

from __future__ import annotations

import asyncio
import logging
import signal

# Import your @workflow-decorated modules so they register before run()
import examples.workflows  # noqa: F401
from pyrula.workflows import WorkflowWorker, open_store


async def main() -> None:
    store = open_store()  # PYRULA_STORE_URL, else sqlite:///pyrula.db in the working directory
    worker = WorkflowWorker(store=store)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.stop)
    loop.add_signal_handler(signal.SIGINT, worker.stop)
    try:
        await worker.run()  # blocks until worker.stop() is called
    finally:
        await store.close()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(main())
