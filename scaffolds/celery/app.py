"""Run a worker on a thread and call a few tasks: `python app.py` exits 0.

In production the worker is its own process: `pyrula worker -A proj`. Here it runs on a
thread only to keep the example in one file.
"""

from proj.celery import app
from proj.tasks import add, send_welcome, tsum

from pyrula_compat import chain, chord
from pyrula_compat.contrib.testing.worker import start_worker


def main() -> int:
    with start_worker(app, concurrency=4):
        assert add.delay(2, 2).get(timeout=30) == 4
        # task_id is the run's id and idempotency key: a repeat returns the first run.
        first = send_welcome.apply_async((42,), countdown=0.5, task_id="welcome:42")
        again = send_welcome.apply_async((42,), countdown=0.5, task_id="welcome:42")
        assert again.id == first.id
        print("welcome:", first.get(timeout=30))
        print("chain:", chain(add.s(1, 2), add.s(3))().get(timeout=30))
        print("chord:", chord(add.s(i, i) for i in range(4))(tsum.s()).get(timeout=30))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
