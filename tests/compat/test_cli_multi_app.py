"""Celery's systemd unit (its daemonizing guide), with ``celery`` replaced by ``pyrula``:
``ExecStart``, ``ExecReload`` and ``ExecStop`` run through ``/bin/sh -c`` as systemd runs
them, with the guide's ``/etc/conf.d/celery`` variables, against the sample project on
SQLite (the broker given by ``-b`` in ``CELERYD_OPTS``). Every worker is killed by its PID
at the end if it still runs."""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path
from typing import Any

import pytest

from pyrula.cli.daemon import pid_running as running
from tests.compat.conftest import HERE, REPO_ROOT, proj_workers, pyrula_command, wait_until
from tests.integration.test_cli_multi import Cluster

pytestmark = pytest.mark.slow
HOST = socket.gethostname()
FILES = "--pidfile=${CELERYD_PID_FILE} --logfile=${CELERYD_LOG_FILE}"
EXEC_START = (
    "${CELERY_BIN} -A $CELERY_APP multi start $CELERYD_NODES "
    + FILES
    + ' --loglevel="${CELERYD_LOG_LEVEL}" $CELERYD_OPTS'
)
EXEC_STOP = (
    "${CELERY_BIN} multi stopwait $CELERYD_NODES " + FILES + ' --loglevel="${CELERYD_LOG_LEVEL}"'
)
EXEC_RELOAD = (
    "${CELERY_BIN} -A $CELERY_APP multi restart $CELERYD_NODES "
    + FILES
    + ' --loglevel="${CELERYD_LOG_LEVEL}" $CELERYD_OPTS'
)


def test_celerys_systemd_unit_runs_with_pyrula(tmp_path: Path, proj_app: Any) -> None:
    import proj.tasks as t

    for folder in ("run", "log"):
        (tmp_path / folder).mkdir()
    url = f"sqlite:///{tmp_path / 'proj.db'}"
    conf = {
        "CELERYD_NODES": "w1 w2",
        "CELERY_BIN": shlex.join(pyrula_command()),
        "CELERY_APP": "proj",
        # --pool threads: -c 8 in one process each (w3 below runs the default prefork pool)
        "CELERYD_OPTS": f"--time-limit=300 --concurrency=8 -c:w2 2 -b {url} "
        "--claim-poll-interval=0.05 --shutdown-grace=3 --pool threads",
        "CELERYD_PID_FILE": f"{tmp_path}/run/%n.pid",
        "CELERYD_LOG_FILE": f"{tmp_path}/log/%n%I.log",
        "CELERYD_LOG_LEVEL": "INFO",
    }
    cluster = Cluster(tmp_path, env={"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])})
    cluster.env.pop("CELERY_BROKER_URL", None)
    try:
        started = cluster.sh(EXEC_START, conf)
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"\t> w2@{HOST}: OK" in started.stdout
        pids = cluster.pids()
        assert set(pids) == {"w1", "w2"}
        first = (tmp_path / "log" / "w1.log").read_text()
        assert "proj.tasks.add" in first and "up to 8 runs at once" in first
        assert "note: --time-limit accepted" in first
        assert "up to 2 runs at once" in (tmp_path / "log" / "w2.log").read_text()
        with proj_workers(url, tmp_path, proj_app):
            assert t.add.delay(2, 2).get(timeout=30) == 4

            reloaded = cluster.sh(EXEC_RELOAD, conf)
            assert reloaded.returncode == 0, reloaded.stdout + reloaded.stderr
            after = cluster.pids()
            assert set(after) == {"w1", "w2"} and not set(after.values()) & set(pids.values())
            assert t.add.delay(20, 22).get(timeout=30) == 42

            # -A after `multi`, as older units give it
            alone = cluster.multi("start", "w3", "-A", "proj", "-b", url, "--pidfile=run/%n.pid")
            assert alone.returncode == 0, alone.stdout + alone.stderr
            log = tmp_path / "w3.log"  # the pool processes' banners follow the supervisor's
            wait_until(lambda: "proj.tasks.add" in log.read_text(), 30, "w3's pool processes")
            assert "through 2 pool processes" in log.read_text()
            assert cluster.multi("stopwait", "w3", "--pidfile=run/%n.pid").returncode == 0

        stopped = cluster.sh(EXEC_STOP, conf)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert cluster.pids() == {}
        assert not any(running(pid) for pid in cluster.seen)
    finally:
        cluster.kill_all()
