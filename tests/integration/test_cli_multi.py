"""``pyrula multi`` as Celery's ``celery multi``: background workers started, shown,
restarted, stopped and killed through their pid files (real processes on SQLite).

Every worker a test starts is found by the pid files in its folder (and every pid seen
there is remembered) and SIGKILLed at teardown if it still runs, after checking that
the process is one of this test's (its working folder is the test's)."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pyrula.cli.daemon import pid_running as running
from pyrula.cli.main import cli
from pyrula.workflows import SqliteStore
from pyrula.workflows.sync import WorkflowClient
from tests.integration.test_cli_worker import FAST, MODULE, REPO_ROOT, pyrula_command

pytestmark = pytest.mark.slow
HOST = socket.gethostname()
TIMEOUT = 90.0


class Cluster:
    """Runs ``pyrula multi`` in ``folder``; kills the workers it left running."""

    def __init__(self, folder: Path, env: dict[str, str] | None = None) -> None:
        self.folder = folder
        self.url = f"sqlite:///{folder / 'pyrula.db'}"
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        self.env.pop("PYRULA_STORE_URL", None)
        self.seen: set[int] = set()

    def multi(self, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [*pyrula_command(), *prefix, "multi", *args], cwd=self.folder, env=self.env,
            capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip
        self.pids()
        return done

    def sh(self, line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """A systemd ``ExecStart=/bin/sh -c '...'`` line, run the same way."""
        done = subprocess.run(
            ["/bin/sh", "-c", line], cwd=self.folder, env={**self.env, **env},
            capture_output=True, text=True, timeout=TIMEOUT, check=False,
        )  # fmt: skip
        self.pids()
        return done

    def pid(self, name: str) -> int:
        text = (self.folder / f"{name}.pid").read_text()
        pid = int(text)
        self.seen.add(pid)
        return pid

    def pids(self) -> dict[str, int]:
        found = {}
        for path in self.folder.rglob("*.pid"):
            text = path.read_text().strip()
            if text.isdigit():
                found[path.stem] = int(text)
        self.seen.update(found.values())
        return found

    def ours(self, pid: int) -> bool:
        try:
            return os.readlink(f"/proc/{pid}/cwd").startswith(str(self.folder))
        except OSError:
            return False

    def kill_all(self) -> None:
        self.pids()
        for pid in self.seen:
            if running(pid) and self.ours(pid):
                os.kill(pid, signal.SIGKILL)
                wait_for(lambda pid=pid: not running(pid), 10, f"pid {pid} to die")


def wait_for(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout}s")
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path)
    try:
        yield nodes
    finally:
        nodes.kill_all()


def serving(cluster: Cluster) -> list[str]:
    return ["-w", MODULE, "--store", cluster.url, *FAST]


def test_start_serves_runs_show_names_and_stopwait(cluster: Cluster) -> None:
    started = cluster.multi("start", "w1", "w2", *serving(cluster), "-c:w1", "3")
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.splitlines()[1:] == [
        "> Starting nodes...", f"\t> w1@{HOST}: OK", f"\t> w2@{HOST}: OK",
    ]  # fmt: skip
    pids = cluster.pids()
    assert set(pids) == {"w1", "w2"} and pids["w1"] != pids["w2"]
    assert all(running(pid) for pid in pids.values())
    assert all(os.getsid(pid) == pid for pid in pids.values())  # sessions of their own
    first, second = (cluster.folder / "w1.log").read_text(), (cluster.folder / "w2.log").read_text()
    assert f"pyrula worker w1@{HOST}-{pids['w1']}-" in first and "up to 3 runs at once" in first
    assert f"(pid {pids['w2']})" in second and "up to 3 runs" not in second
    with WorkflowClient(SqliteStore(cluster.folder / "pyrula.db")) as client:
        assert client.submit("cli_add", {"a": 2, "b": 3}).result(timeout=30)["sum"] == 5

    shown = cluster.multi("show", "w1", "w2", *serving(cluster), "-c:w1", "3")
    assert shown.returncode == 0, shown.stderr
    lines = [shlex.split(line) for line in shown.stdout.splitlines()]
    assert [line[line.index("-n") + 1] for line in lines] == [f"w1@{HOST}", f"w2@{HOST}"]
    for name, words in zip(("w1", "w2"), lines, strict=True):
        assert words[words.index("-m") + 1 : words.index("-n")] == [
            "pyrula.cli.main",
            "worker",
            "-D",
        ]
        assert f"--pidfile={name}.pid" in words and f"--logfile={name}%I.log" in words
        assert words[words.index("-w") : words.index("-w") + 2] == ["-w", MODULE]
    assert "-c" in lines[0] and "-c" not in lines[1]
    names = cluster.multi("names", "w1", "w2")
    assert names.stdout.splitlines() == [f"w1@{HOST}", f"w2@{HOST}"]

    stopped = cluster.multi("stopwait", "w1", "w2")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert f"\t> w1@{HOST}: TERM -> {pids['w1']}" in stopped.stdout
    assert f"\t> w2@{HOST}: OK" in stopped.stdout
    assert not any(running(pid) for pid in pids.values())
    assert cluster.pids() == {}
    assert "stopped" in (cluster.folder / "w1.log").read_text()
    again = cluster.multi("stopwait", "w1", "w2", "--nosplash")
    assert again.returncode == 0
    assert again.stdout.splitlines() == [f"> w1@{HOST}: DOWN", f"> w2@{HOST}: DOWN"]


def test_restart_gives_new_processes_and_kill_kills(cluster: Cluster) -> None:
    args = ("2", *serving(cluster))
    assert cluster.multi("start", *args).returncode == 0
    before = cluster.pids()
    assert set(before) == {"celery1", "celery2"}
    restarted = cluster.multi("restart", *args)
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    assert f"> Restarting node celery1@{HOST}: OK" in restarted.stdout
    after = cluster.pids()
    assert set(after) == set(before) and not set(after.values()) & set(before.values())
    assert not any(running(pid) for pid in before.values())
    assert all(running(pid) for pid in after.values())
    # Each node is started again as it goes down (Celery's order), one that was down at once.
    lines = restarted.stdout.splitlines()
    down, again = (
        lines.index(f"\t> celery1@{HOST}: OK"),
        lines.index(f"> Restarting node celery1@{HOST}: OK"),
    )
    assert down < again
    assert cluster.multi("stopwait", "2", *serving(cluster)).returncode == 0
    assert cluster.multi("start", "1", *serving(cluster)).returncode == 0  # celery1 only
    partly = cluster.multi("restart", *args)
    assert partly.returncode == 0, partly.stdout + partly.stderr
    assert f"> celery2@{HOST}: DOWN" in partly.stdout
    assert set(cluster.pids()) == {"celery1", "celery2"}
    after = cluster.pids()

    killed = cluster.multi("kill", "2")
    assert killed.returncode == 0, killed.stdout + killed.stderr
    assert f"Sending KILL to node celery2@{HOST} ({after['celery2']})" in killed.stdout
    assert not any(running(pid) for pid in after.values())
    assert cluster.pids() == {}  # a killed worker cannot remove its pid file: multi did


def test_a_node_already_running_is_not_started_twice(cluster: Cluster) -> None:
    assert cluster.multi("start", "w1", *serving(cluster)).returncode == 0
    first = cluster.pid("w1")
    again = cluster.multi("start", "w1", "w2", *serving(cluster))
    assert again.returncode == 1, again.stdout + again.stderr
    assert f"\t> w1@{HOST}: FAILED" in again.stdout and f"\t> w2@{HOST}: OK" in again.stdout
    assert f"names the live process {first}" in again.stderr
    assert cluster.pid("w1") == first and running(first)
    stop = cluster.multi("stop", "w1", "w2", "-INT")  # no wait
    assert stop.returncode == 0
    assert f"\t> w1@{HOST}: INT -> {first}" in stop.stdout
    wait_for(lambda: not running(first), 30, "w1 to exit after stop")


def test_a_worker_that_cannot_start_fails_the_start_at_once(cluster: Cluster) -> None:
    failed = cluster.multi("start", "w1", "-w", "no_such_module_here", "--store", cluster.url)
    assert failed.returncode == 1
    assert f"\t> w1@{HOST}: FAILED" in failed.stdout
    assert "exited with code 2" in failed.stderr
    assert "cannot import workflow module 'no_such_module_here'" in failed.stderr
    assert cluster.pids() == {}
    missing = cluster.multi("start", "w1", *serving(cluster), "--pidfile=/no/such/dir/%n.pid")
    assert missing.returncode == 1
    assert "no folder /no/such/dir for the pid file /no/such/dir/w1.pid" in missing.stderr


def test_workdir_and_file_names_in_other_folders(cluster: Cluster) -> None:
    """Relative file names are under --workdir, which the workers run in; %n and %I
    expand; the node's own option wins for that node."""
    work = cluster.folder / "work"
    (work / "run").mkdir(parents=True)
    args = (
        "start", "a", "b", *serving(cluster), f"--workdir={work}", "--pidfile=run/%n.pid",
        "--logfile=%n-%I.log", "--loglevel:b=DEBUG", "--verbose",
    )  # fmt: skip
    started = cluster.multi(*args)
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"worker -D -n b@{HOST} --pidfile=run/b.pid --logfile=b-%I.log" in started.stdout
    assert {p.name for p in (work / "run").iterdir()} == {"a.pid", "b.pid"}
    assert "DEBUG" in (work / "b-.log").read_text()
    assert "DEBUG" not in (work / "a-.log").read_text()
    stopped = cluster.multi("stopwait", "a", "b", f"--workdir={work}", "--pidfile=run/%n.pid")
    assert stopped.returncode == 0 and list((work / "run").iterdir()) == []


# -- parsing, in this process (no worker started) -------------------------------------
def multi(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["multi", *args])
    return result.exit_code, result.output


def shown(*args: str) -> list[list[str]]:
    code, output = multi("show", *args)
    assert code == 0, output
    return [shlex.split(line)[4:] for line in output.splitlines()]  # after `worker`


def test_show_follows_celerys_examples() -> None:
    lines = shown("10", "-l", "INFO", "-Q:1-3", "images,video", "-Q:4,5", "data", "-Q", "default")
    assert [w[w.index("-n") + 1] for w in lines] == [f"celery{n}@{HOST}" for n in range(1, 11)]
    queues = [w[w.index("-Q") + 1] for w in lines]
    assert queues == ["images,video"] * 3 + ["data"] * 2 + ["default"] * 5
    assert all(w[w.index("-l") + 1] == "INFO" for w in lines)
    lines = shown("image", "video", "data", "-c", "3", "-c:image", "10")
    assert [w[w.index("-c") + 1] for w in lines] == ["10", "3", "3"]
    lines = shown("foo", "bar", "baz", "xuzzy", "-c", "3", "-c:foo,bar,baz", "10", "-c:4", "5")
    assert [w[w.index("-c") + 1] for w in lines] == ["10", "10", "10", "5"]
    lines = shown("2", "--hostname=worker.example.com", "--range-prefix=w", "-D", "-E")
    assert [w[:3] for w in lines] == [["-D", "-n", "w1@worker.example.com"],
                                      ["-D", "-n", "w2@worker.example.com"]]  # fmt: skip
    assert all(w.count("-D") == 1 and "-E" in w for w in lines)
    (line,) = shown("foo@%h", "--logfile=/var/log/%n/%h-%d%I.log", "--concurrency", "4")
    assert line[:3] == ["-D", "-n", f"foo@{HOST}"]
    assert f"--logfile=/var/log/foo/foo@{HOST}-{HOST}%I.log" in line
    assert "--concurrency=4" in line


def test_names_expand_get_and_the_app_before_multi() -> None:
    assert multi("names", "3")[1].split() == [f"celery{n}@{HOST}" for n in (1, 2, 3)]
    code, output = multi("expand", "%n.pid", "w1", "w2@box")
    assert (code, output.split()) == (0, ["w1.pid", "w2.pid"])
    code, output = multi("get", f"w2@{HOST}", "w1", "w2", "-c:w2", "7")
    assert code == 0 and "-c 7" in output and f"-n w2@{HOST}" in output
    assert multi("get", "w3", "w1", "w2")[0] == 1
    result = CliRunner().invoke(cli, ["-A", "proj", "multi", "show", "w1", "-c", "2"])
    assert result.exit_code == 0, result.output
    assert "worker -D -n w1@" in result.output and " -A proj " in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus", "w1"], "unknown multi command 'bogus'"),
        (["show", "3", "-c:4", "2"], "-c:4: 4 is not a node index or range within 1-3"),
        (["show", "3", "-c:3-1", "2"], "-c:3-1: 3-1 is not a node index or range"),
        (["show", "w1", "w2", "-c:w3", "2"], "-c:w3: no node named 'w3'"),
        (["show", "w1", "-c"], "-c needs a value"),
        (["show"], "no nodes"),
        (["show", "0"], "0 nodes"),
        (["start", "w1", "-9"], "takes no signal"),
        (["show", "w1", "--", "broker_pool_limit=10"], "settings after `--` are not supported"),
        (["show", "w1", "w1"], "is named twice"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    code, output = multi(*args)
    assert code == 2, output
    assert message in output
