"""The sample app (``proj``) with a receiver on every worker signal, for
``test_cli_recycle_app.py``: served as ``pyrula worker -A proj_lifecycle``.

With ``LIFECYCLE_SIGNALS=<path>`` in its environment, each process appends one line
``<signal-name> <pid>`` to ``<path>`` per signal it sends, and ``worker_shutting_down``
writes its ``sig``, ``how`` and ``exitcode`` (``SIGINT Warm 1``) to ``<path>.stop``.
``setup_logging`` is not
connected: a receiver would replace pyrula's logging set-up (and with it
``after_setup_logger``/``after_setup_task_logger``, which are).
"""

import os

from proj.celery import app

from pyrula_compat import signals

WORKER_SIGNALS = (
    "celeryd_init",
    "import_modules",
    "celeryd_after_setup",
    "worker_init",
    "worker_process_init",
    "worker_ready",
    "worker_shutting_down",
    "worker_process_shutdown",
    "worker_shutdown",
    "after_setup_logger",
    "after_setup_task_logger",
)


def _record(name):
    path = os.environ.get("LIFECYCLE_SIGNALS")
    if path:
        with open(path, "a") as handle:
            handle.write(f"{name} {os.getpid()}\n")


def _receiver(name):
    def receiver(sender=None, **kwargs):
        _record(name)

    return receiver


def _shutting_down(sender=None, sig=None, how=None, exitcode=None, **kwargs):
    path = os.environ.get("LIFECYCLE_SIGNALS")
    if path:
        with open(f"{path}.stop", "a") as handle:
            handle.write(f"{sig} {how} {exitcode}\n")


for _name in WORKER_SIGNALS:
    getattr(signals, _name).connect(_receiver(_name), weak=False)
signals.worker_shutting_down.connect(_shutting_down, weak=False)
app.on_after_configure.connect(_receiver("on_after_configure"), weak=False)

__all__ = ["app"]
