"""Tasks for ``test_prefork.py``, imported by its workers (``-A proj_pool``) and by the
test process (to call them). Each task appends ``<pid> <what>`` lines to a file the
test names, so the test sees which pool process ran what."""

import os
import time

from proj.celery import app

from pyrula_compat import signals
from pyrula_compat.exceptions import SoftTimeLimitExceeded


def _append(path, line):
    with open(path, "a") as handle:
        handle.write(f"{os.getpid()} {line}\n")


@signals.worker_process_init.connect
def _process_init(**_kwargs):
    path = os.environ.get("POOL_SIGNALS")
    if path:
        _append(path, "worker_process_init")


@signals.worker_process_shutdown.connect
def _process_shutdown(**_kwargs):
    path = os.environ.get("POOL_SIGNALS")
    if path:
        _append(path, "worker_process_shutdown")


def _count(path, what):
    with open(path) as handle:
        return sum(line.split(" ", 1)[1] == f"{what}\n" for line in handle)


@app.task(name="proj_pool.meet")
def meet(path, parties, timeout=30.0):
    """Say it started, then wait until ``parties`` tasks did (running at the same time,
    they meet at once; run one after the other, the first gives up after ``timeout`` and
    says so); say it ended; returns this process's pid."""
    _append(path, "start")
    deadline = time.monotonic() + timeout
    while _count(path, "start") < parties:
        if time.monotonic() > deadline:
            _append(path, "alone")
            break
        time.sleep(0.01)
    _append(path, "end")
    return os.getpid()


@app.task(name="proj_pool.hold")
def hold(path, seconds):
    """Say it started, sleep ``seconds``, say it ended; returns this process's pid."""
    _append(path, "start")
    time.sleep(seconds)
    _append(path, "end")
    return os.getpid()


@app.task(name="proj_pool.pid")
def pid(path):
    _append(path, "ran")
    return os.getpid()


@app.task(name="proj_pool.stuck", soft_time_limit=0.5, time_limit=1.5)
def stuck(path):
    """Catches its soft limit (raised into the body's thread between two short sleeps),
    then blocks in C past its hard one."""
    _append(path, "start")
    try:
        while True:
            time.sleep(0.01)
    except SoftTimeLimitExceeded:
        _append(path, "soft")
    time.sleep(5)
    _append(path, "survived")
    return "survived"
