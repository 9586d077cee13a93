"""``pyrula worker -A proj`` with Celery's global options as deployment scripts give
them: ``-b/--broker`` picks the store, ``--config`` loads a settings module, ``-I``
imports more task modules, ``--result-backend`` is checked like the setting, and
``-n`` names the node in ``--logfile``/``--pidfile`` (real worker processes on SQLite,
stopped by PID). The same options before the subcommand, as ``celery -A proj -b URL
worker`` gives them, mean the same (a real worker, a real ``multi`` cluster, and
CliRunner parse checks); before status, inspect, purge, call, result and control,
``-b`` is their store and ``--result-backend`` is checked against it."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pyrula.cli.main import cli
from tests.compat.conftest import (
    FAST,
    HERE,
    REPO_ROOT,
    WorkerProcess,
    Workers,
    proj_workers,
    pyrula_command,
    wait_until,
)
from tests.compat.test_cli_inspect import run_cli
from tests.integration.test_cli_multi import Cluster

pytestmark = pytest.mark.slow


def test_broker_config_include_and_node_named_files(tmp_path: Path, proj_app: Any) -> None:
    url = f"sqlite:///{tmp_path / 'flags.db'}"
    (tmp_path / "flag_settings.py").write_text('imports = ["proj_extra"]\n')
    (tmp_path / "flag_tasks.py").write_text(
        "from proj.celery import app\n\n"
        "@app.task(name='flags.ping')\ndef ping():\n    return 'pong'\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE), str(REPO_ROOT)])}
    with proj_workers(url, tmp_path, proj_app) as workers:
        workers.broker = "sqlite:///not-this-one.db"  # the environment's: -b must win
        worker = workers.start(
            "-b", url, "--config", "flag_settings", "-I", "flag_tasks", "-n", "w7@%h",
            "--pidfile", f"{tmp_path}/%n.pid", "--logfile", f"{tmp_path}/%n%I.log",
            "--skip-checks", "-q", "--no-color",
            env=env,
        )  # fmt: skip
        assert "flags.ping" in worker.stdout  # -I
        assert "proj.extra.shout" in worker.stdout  # --config's imports
        assert (tmp_path / "w7.pid").read_text() == f"{worker.proc.pid}\n"
        result = proj_app.send_task("proj.extra.shout", args=["hi"])
        assert result.get(timeout=30) == "HI!"
        assert proj_app.send_task("flags.ping").get(timeout=30) == "pong"
        assert worker.stop() == 0
    assert not (tmp_path / "w7.pid").exists()
    assert f"w7@{socket.gethostname()}" not in worker.stderr
    # the worker's own lines, in Celery's worker_log_format
    assert "INFO/MainProcess] worker w7@" in (tmp_path / "w7.log").read_text()
    assert not (HERE / "not-this-one.db").exists()


def test_a_result_backend_on_another_server_is_a_usage_error(tmp_path: Path) -> None:
    workers = Workers(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    try:
        worker = workers.start("--result-backend", "redis://elsewhere.invalid:6379/0", wait=False)
        assert worker.proc.wait(30) == 2, worker.stderr
        assert "result_backend" in worker.stderr or "backend" in worker.stderr
        assert "Traceback" not in worker.stderr
    finally:
        workers.kill_all()


def test_a_config_module_that_does_not_import_is_a_usage_error(tmp_path: Path) -> None:
    workers = Workers(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    try:
        worker = workers.start("--config", "no_such_settings_module", wait=False)
        assert worker.proc.wait(30) == 2, worker.stderr
        assert "cannot load configuration 'no_such_settings_module'" in worker.stderr
        assert "Traceback" not in worker.stderr
    finally:
        workers.kill_all()


def test_purge_revokes_the_apps_waiting_tasks_before_serving(tmp_path: Path, proj_app: Any) -> None:
    import proj.tasks as t

    url = f"sqlite:///{tmp_path / 'purge.db'}"
    with proj_workers(url, tmp_path, proj_app) as workers:
        waiting = [t.add.delay(i, i) for i in range(3)] + [t.add.apply_async((1, 1), countdown=600)]
        worker = workers.start("--purge")
        assert "--purge: discarded 4 waiting run(s)" in worker.stdout, worker.stdout
        assert [r.state for r in waiting] == ["REVOKED"] * 4
        assert t.add.delay(20, 22).get(timeout=30) == 42  # sent after: served
        assert worker.stop() == 0


# -- Celery's global options before the subcommand -------------------------------------
def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), prog_name="pyrula", catch_exceptions=False)
    return result.exit_code, result.output


def test_global_options_before_worker_serve_the_app(tmp_path: Path, proj_app: Any) -> None:
    """``pyrula -A proj -b URL --config MOD --workdir DIR worker``: -b wins over the
    environment's broker, --workdir makes DIR's settings module importable for --config."""
    url = f"sqlite:///{tmp_path / 'before.db'}"
    (tmp_path / "before_settings.py").write_text('imports = ["proj_extra"]\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])}
    env.pop("PYRULA_STORE_URL", None)
    env["CELERY_BROKER_URL"] = f"sqlite:///{tmp_path / 'not-this-one.db'}"
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    command = [
        *pyrula_command(), "-A", "proj", "-b", url, "--config", "before_settings",
        "--workdir", str(tmp_path), "--loader", "x", "-q", "-C",
        "worker", "-l", "info", *FAST,
    ]  # fmt: skip
    with proj_workers(url, tmp_path, proj_app), out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            command, cwd=HERE, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL
        )
        worker = WorkerProcess(proc, out, err)
        try:
            worker.wait_started()
            assert f"on {url}" in worker.stdout, worker.stdout  # the banner: -b's store
            assert "proj.extra.shout" in worker.stdout  # --config's imports
            assert proj_app.send_task("proj.extra.shout", args=["hi"]).get(timeout=30) == "HI!"
        finally:
            assert worker.stop() == 0
    assert "note: --loader accepted, no effect." in worker.stderr
    assert not (tmp_path / "not-this-one.db").exists()


def test_global_options_before_multi_reach_every_node(tmp_path: Path, proj_app: Any) -> None:
    """``pyrula -A proj -b URL multi start w1``: the node's worker serves -b's store."""
    import proj.tasks as t

    url = f"sqlite:///{tmp_path / 'multi.db'}"
    cluster = Cluster(tmp_path, env={"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO_ROOT)])})
    cluster.env["CELERY_BROKER_URL"] = f"sqlite:///{tmp_path / 'not-this-one.db'}"
    prefix = ("-A", "proj", "-b", url, "-q")
    try:
        started = cluster.multi("start", "w1", "--claim-poll-interval=0.05", prefix=prefix)
        assert started.returncode == 0, started.stdout + started.stderr
        assert started.stdout == ""  # -q before multi: multi's own --quiet
        assert set(cluster.pids()) == {"w1"}
        assert f"on {url}" in (tmp_path / "w1.log").read_text()
        with proj_workers(url, tmp_path, proj_app):
            assert t.add.delay(2, 3).get(timeout=30) == 5
        stopped = cluster.multi("stopwait", "w1", prefix=prefix)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert cluster.pids() == {}
    finally:
        cluster.kill_all()
    assert not (tmp_path / "not-this-one.db").exists()


def test_multi_show_puts_the_global_options_on_every_node() -> None:
    url = "sqlite:////srv/app/pyrula.db"
    code, out = run("-A", "proj", "-b", url, "--config", "settings", "-q", "-C",
                    "multi", "show", "w1", "w2", "-c", "2")  # fmt: skip
    assert code == 0, out
    lines = [shlex.split(line) for line in out.splitlines()]
    assert len(lines) == 2
    for words in lines:
        assert words[words.index("-A") + 1] == "proj"
        assert words[words.index("-b") + 1] == url and words.count("-b") == 1
        assert "--config=settings" in words
        assert "-q" not in words and "-C" not in words  # multi's own flags
    same = run("-A", "proj", "-b", url, "multi", "show", "w1", "-b:w1", url)
    assert same[0] == 0 and shlex.split(same[1]).count("-b") == 1


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (["-b", "sqlite:///a.db"], ["-b", "sqlite:///b.db"]),
        (["--broker=sqlite:///a.db"], ["--broker", "sqlite:///b.db"]),
        (["--result-backend", "sqlite:///a.db"], ["--result-backend", "sqlite:///b.db"]),
        (["--config", "one"], ["--config", "two"]),
        (["--workdir", "/"], ["--workdir", "/tmp"]),
    ],
)
@pytest.mark.parametrize("command", ["worker", "beat"])
def test_a_global_option_before_and_after_with_different_values(
    command: str, before: list[str], after: list[str]
) -> None:
    code, out = run("-A", "proj", *before, command, *after)
    assert code == 2, out
    assert "given twice with different values" in out and "before the command" in out


def test_the_same_value_before_and_after_is_accepted() -> None:
    code, out = run("-b", "sqlite:///a.db", "worker", "-b", "sqlite:///a.db", "-w", "no_such_xyz")
    assert code == 2 and "no_such_xyz" in out and "twice" not in out


def test_an_amqp_broker_for_a_worker_without_an_app_is_a_usage_error() -> None:
    code, out = run("worker", "-b", "amqp://guest:secret@localhost//", "-w", "no_such_xyz")
    assert code == 2 and "amqp://guest:***@localhost//" in out and "secret" not in out


def test_a_password_is_masked_in_the_different_values_error() -> None:
    code, out = run("-b", "redis://u:secret@h:6379/0", "worker", "-b", "sqlite:///b.db")
    assert code == 2 and "redis://u:***@h:6379/0" in out and "secret" not in out


def test_multi_node_with_another_value_is_a_usage_error() -> None:
    code, out = run("-b", "sqlite:///a.db", "multi", "show", "w1", "w2", "-b:w2", "sqlite:///b.db")
    assert code == 2
    assert "-b/--broker given twice with different values: 'sqlite:///a.db' before `multi`" in out


@pytest.mark.parametrize(
    ("option", "command"),
    [
        (["-b", "sqlite:///a.db"], ["runs", "list"]),
        (["--result-backend", "sqlite:///a.db"], ["schedules", "list"]),
        (["--config", "settings"], ["init"]),
        (["--workdir", "/tmp"], ["runs", "list"]),
        (["--loader", "x"], ["runs", "list"]),
        (["-q"], ["runs", "list"]),
        (["-C"], ["db", "check"]),
    ],
)
def test_a_global_option_before_a_command_that_takes_no_app(
    option: list[str], command: list[str]
) -> None:
    code, out = run(*option, *command)
    assert code == 2, out
    assert f"before `pyrula {command[0]}`: only `pyrula worker`, `pyrula beat`" in out


def test_broker_before_the_client_commands_names_their_store(tmp_path: Path, proj_app: Any) -> None:
    """``pyrula [-A proj] -b URL status|inspect|call|result|control|purge``: -b is their
    --store, mapped as the app maps a broker URL (``sqla+sqlite://``), and wins over the
    app's own broker and PYRULA_STORE_URL (both naming another store here)."""
    import proj.tasks as t

    url = f"sqlite:///{tmp_path / 'client.db'}"
    elsewhere = f"sqlite:///{tmp_path / 'not-this-one.db'}"
    broker = ("-b", f"sqla+{url}")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, broker=elsewhere, env={"PYRULA_STORE_URL": elsewhere})

    with proj_workers(url, tmp_path, proj_app) as workers:
        worker = workers.start()
        node = worker.stdout.split()[2]  # pyrula worker <id> (pid ...)
        status = wait_until(
            lambda: (done := cli(*broker, "status")).returncode == 0 and done, 20, "status"
        )
        assert status.stdout == f"->  {node}: OK\n\n1 node online.\n", status.stdout
        registered = cli("-A", "proj", *broker, "inspect", "registered", "-j")
        assert "proj.tasks.add" in json.loads(registered.stdout)[node], registered.stderr
        sent = cli("-A", "proj", *broker, "call", "proj.tasks.add", "--args", "[1, 2]")
        assert sent.returncode == 0, sent.stderr
        result = cli("-A", "proj", *broker, "result", sent.stdout.strip(), "--timeout", "30")
        assert (result.returncode, result.stdout) == (0, "3\n"), result.stderr
        revoked, purged = (t.add.apply_async((1, 1), countdown=600) for _ in range(2))
        control = cli("-A", "proj", *broker, "control", "revoke", revoked.id)
        assert control.returncode == 0 and revoked.state == "REVOKED", control.stderr
        purge = cli("-A", "proj", *broker, "purge", "-f")
        assert purge.stdout == "Purged 1 message from 1 known task queue.\n", purge.stderr
        assert purged.state == "REVOKED"
        assert worker.stop() == 0
    assert not (tmp_path / "not-this-one.db").exists()


def test_broker_and_store_naming_different_stores_is_a_usage_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    code, out = run("-b", url, "status", "--store", f"sqlite:///{tmp_path / 'b.db'}")
    assert code == 2, out
    assert f"-b/--broker '{url}' before the command and --store " in out
    assert "name different stores" in out
    same = run("-b", f"sqla+{url}", "status", "--store", url)  # the same store: no error
    assert same[0] == 69 and "No nodes replied" in same[1], same[1]


def test_a_broker_pyrula_does_not_need_before_a_client_command() -> None:
    code, out = run("-b", "amqp://guest:secret@rabbit:5672//", "purge", "-f", "--workflow", "x")
    assert code == 2, out
    assert out.startswith("Error: -b/--broker amqp://guest:***@rabbit:5672//: ")
    assert "pyrula needs no separate message broker" in out and "secret" not in out


def test_a_result_backend_before_a_client_command_must_name_the_stores_server(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    other = "redis://u:secret@elsewhere.invalid:6379/0"
    for args in (["-b", url, "--result-backend", other, "inspect", "active"],
                 ["--result-backend", other, "status", "--store", url]):  # fmt: skip
        code, out = run(*args)
        assert code == 2, out
        assert "Error: --result-backend redis://u:***@elsewhere.invalid:6379/0: " in out
        assert "names a different server" in out and "secret" not in out
    code, out = run("-b", url, "--result-backend", f"db+{url}", "status")
    assert code == 69 and "No nodes replied" in out, out


def test_no_effect_options_before_a_client_command_are_accepted() -> None:
    code, out = run("-q", "-C", "--loader", "x", "-A", "no_such_celery_project_xyz", "status")
    assert code == 2 and "cannot load the app" in out  # got past the options to -A
    assert "note: --loader accepted, no effect." in out


def test_group_help_lists_the_global_options() -> None:
    code, out = run("-b", "sqlite:///a.db", "--help")
    assert code == 0
    for shown in ("-A, --app APP", "-b, --broker URL", "--result-backend URL",
                  "--config MODULE", "--workdir DIR", "--loader LOADER", "-q, --quiet",
                  "-C, --no-color"):  # fmt: skip
        assert shown in out, shown
