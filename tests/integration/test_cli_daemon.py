"""Celery's daemon and worker flags on ``pyrula worker`` (real processes on SQLite):
``--concurrency``, ``-n`` with ``--logfile``/``--pidfile`` and their ``%n`` names,
``--detach``, ``--workdir``, ``--umask``, ``--uid``, ``-I``, ``-b`` and ``--purge``, and
the notes for flags that mean nothing here. Every process started is stopped by PID,
the detached one by the PID its pid file holds.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrula.cli.daemon import Daemon, expand_path, node_name, write_pidfile
from pyrula.cli.main import cli
from pyrula.workflows import RunStatus
from pyrula.workflows.sync import WorkflowClient
from tests.integration.test_cli_worker import (  # noqa: F401  (fixtures: client, workers)
    FAST,
    MODULE,
    REPO_ROOT,
    Workers,
    client,
    pyrula_command,
    runs_in,
    workers,
)

pytestmark = pytest.mark.slow
HOST = socket.gethostname()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout}s")
        time.sleep(0.05)


# -- names ---------------------------------------------------------------------------
def test_node_names_and_file_names_expand_as_in_celery() -> None:
    name, _, domain = HOST.partition(".")
    assert node_name(None) == f"celery@{HOST}"
    assert node_name("w1@%h") == f"w1@{HOST}"
    assert node_name("w1") == f"w1@{HOST}"
    assert node_name("%n.worker@%d") == f"{name}.worker@{domain}"
    assert expand_path("/var/log/%n%I.log", "w1@box.example") == "/var/log/w1.log"
    assert expand_path("/run/%p-%i.pid", "w1@box.example") == "/run/w1@box.example-0.pid"
    assert expand_path("%h/%d/100%%/%x", "w1@box.example") == "box.example/example/100%/%x"


def test_a_pid_file_of_a_dead_process_is_replaced_and_of_a_live_one_refused(
    tmp_path: Path,
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    path = tmp_path / "w.pid"
    path.write_text(f"{dead.pid}\n")
    write_pidfile(str(path))
    assert path.read_text() == f"{os.getpid()}\n"
    path.write_text("1\n")  # init: alive
    with pytest.raises(Exception, match="already running"):
        write_pidfile(str(path))
    assert path.read_text() == "1\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--umask", "9x"], "--umask '9x': give an octal number"),
        (["--uid", "no-such-user-here"], "--uid no-such-user-here: no such user"),
        (["--gid", "no-such-group-here"], "--gid no-such-group-here: no such group"),
        (["--workdir", "/no/such/dir"], "--workdir /no/such/dir"),
        (["--logfile", "/no/such/dir/w.log"], "--logfile /no/such/dir/w.log"),
    ],
)
def test_bad_daemon_options_exit_2_with_the_flag_named(flags: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "-w", MODULE, "--store", "memory://", *flags])
    assert result.exit_code == 2, result.output
    assert message in result.output


# -- a real worker ---------------------------------------------------------------------
def test_concurrency_hostname_logfile_and_pidfile(
    workers: Workers,  # noqa: F811
    client: WorkflowClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    worker = workers.serve(
        "--concurrency", "3", "-n", "w1@%h", "--logfile", f"{tmp_path}/%n.log",
        "--pidfile", f"{tmp_path}/%n.pid", "-S", "state.db", "--heartbeat-interval", "5",
    )  # fmt: skip
    assert "up to 3 runs at once" in worker.stdout
    pidfile, logfile = tmp_path / "w1.pid", tmp_path / "w1.log"
    assert pidfile.read_text() == f"{worker.proc.pid}\n"
    assert client.submit("cli_add", {"a": 1, "b": 2}).result(timeout=30)["sum"] == 3
    assert "note: -S accepted, no effect" in worker.stderr
    assert "note: --heartbeat-interval accepted, no effect" in worker.stderr
    assert worker.stop() == 0
    log = logfile.read_text()
    assert "serving cli_add" in log and "stopped" in log
    assert "pyrula.workflows.worker" not in worker.stderr  # records went to the file
    assert not pidfile.exists()


def test_a_second_worker_on_the_same_pidfile_is_refused(
    workers: Workers,  # noqa: F811
    tmp_path: Path,
) -> None:
    first = workers.serve("--pidfile", str(tmp_path / "w.pid"))
    second = workers.start(
        "--workflow", MODULE, "--store", workers.url, "--pidfile", str(tmp_path / "w.pid"),
        wait=False,
    )  # fmt: skip
    assert second.proc.wait(30) == 1
    assert f"already running (pid {first.proc.pid})" in second.stderr.replace("\n", " ")
    assert (tmp_path / "w.pid").read_text() == f"{first.proc.pid}\n"
    assert first.stop() == 0


def test_detach_serves_in_the_background_until_signalled(
    workers: Workers,  # noqa: F811
    client: WorkflowClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    pidfile, logfile = tmp_path / "bg.pid", tmp_path / "bg.log"
    (tmp_path / "sub").mkdir()  # a relative --workdir: the background process goes there too
    foreground = workers.start(
        "--workflow", MODULE, "--store", workers.url, *FAST, "--detach",
        "--pidfile", str(pidfile), "--logfile", str(logfile), "--workdir", "sub",
        cwd=tmp_path, wait=False,
    )  # fmt: skip
    assert foreground.proc.wait(30) == 0, foreground.stderr
    assert "started in the background" in foreground.stdout
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "pid file")
    pid = int(pidfile.read_text())
    try:
        assert pid != foreground.proc.pid
        assert os.getsid(pid) == pid  # a session of its own
        assert client.submit("cli_add", {"a": 2, "b": 2}).result(timeout=30)["sum"] == 4
    finally:
        os.kill(pid, signal.SIGTERM)
        _wait_for(lambda: not _alive(pid), 30, "detached worker exit")
    assert not pidfile.exists()
    assert "stopped" in logfile.read_text()


def test_workdir_umask_include_and_broker_without_an_app(
    workers: Workers,  # noqa: F811
    client: WorkflowClient,  # noqa: F811
    tmp_path: Path,
) -> None:
    """``-I`` imports the module and ``-b`` names the store, as they would for an app
    (Celery's ``sqla+sqlite://`` spelling mapped as an app's broker URL is); ``--workdir``
    makes the module importable from elsewhere; ``--umask`` shapes the files the worker
    creates."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = workers.start(
        "-I", MODULE, "-b", "sqla+" + workers.url, "--workdir", str(REPO_ROOT), "--umask", "077",
        "--logfile", str(tmp_path / "w.log"), *FAST, cwd=elsewhere,
    )  # fmt: skip
    assert client.submit("cli_add", {"a": 5, "b": 5}).result(timeout=30)["sum"] == 10
    assert (tmp_path / "w.log").stat().st_mode & 0o777 == 0o600
    assert worker.stop() == 0


def test_purge_discards_waiting_runs_before_serving(
    workers: Workers,  # noqa: F811
    client: WorkflowClient,  # noqa: F811
) -> None:
    waiting = [client.submit("cli_add", {"a": i, "b": 0}) for i in range(3)]
    delayed = client.submit("cli_add", {"a": 9, "b": 0}, delay=3600)
    worker = workers.serve("--purge")
    assert "--purge: discarded 4 waiting run(s)" in worker.stdout
    assert sorted(runs_in(client, RunStatus.CANCELLED)) == sorted(
        h.run_id for h in [*waiting, delayed]
    )
    after = client.submit("cli_add", {"a": 1, "b": 1})
    assert after.result(timeout=30)["sum"] == 2
    assert worker.stop() == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_uid_and_gid_switch_the_process_user_and_group() -> None:
    """In a forked child (nothing is imported after the switch: this interpreter's files
    may not be readable by nobody)."""
    nobody, nogroup = pwd.getpwnam("nobody"), grp.getgrgid(pwd.getpwnam("nobody").pw_gid)
    daemon = Daemon.from_values({"uid": "nobody", "gid": nogroup.gr_name})
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: switch, report, leave without cleanup
        try:
            daemon.drop_privileges()
            os.write(write, f"{os.getuid()} {os.geteuid()} {os.getgid()} {os.getgroups()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    reported = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert reported == f"{nobody.pw_uid} {nobody.pw_uid} {nogroup.gr_gid} [{nogroup.gr_gid}]"


def test_node_names_lead_worker_ids_and_pick_workers_for_inspect(workers: Workers) -> None:  # noqa: F811
    """``-n w1@%h``: the worker id starts with the node name (and stays unique); ``pyrula
    inspect -d w1@HOST`` picks that node's worker, ``-d celery@HOST`` the workers started
    without ``-n``."""
    first = workers.serve("-n", "w1@%h")
    second = workers.serve("-n", "w2@%h")
    plain = workers.serve()
    assert first.worker_id.startswith(f"w1@{HOST}-{first.proc.pid}-")
    assert second.worker_id.startswith(f"w2@{HOST}-")
    assert "@" not in plain.worker_id

    def pinged(destination: str) -> str:
        done = subprocess.run(
            [*pyrula_command(), "inspect", "ping", "--store", workers.url, "-d", destination],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        return done.stdout

    answer = pinged(f"w1@{HOST}")
    assert first.worker_id in answer and second.worker_id not in answer, answer
    answer = pinged(f"celery@{HOST}")
    assert plain.worker_id in answer and first.worker_id not in answer, answer
    for worker in (first, second, plain):
        assert worker.stop() == 0
