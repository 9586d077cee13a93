"""What a user sees first when the Valkey server is down, at start and mid-run: one clear
line naming the URL (password masked), never a traceback, from every entry point:
``ValkeyStore.open()``, ``open_store(url)``, ``pyrula runs list``, ``pyrula worker``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyrula.workflows import ConfigurationError, StoreUnavailable, open_store
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.sync import WorkflowClient
from tests.fixtures import cli_workflows
from tests.valkey.servers import ValkeyProcess, free_port, fresh_namespace

REPO_ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.fixtures.cli_workflows"
assert cli_workflows.cli_add.name == "cli_add"  # registers the workflows for submit()


def pyrula_command() -> list[str]:
    script = Path(sys.executable).with_name("pyrula")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pyrula.cli.main"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*pyrula_command(), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYRULA_STORE_URL": ""},
    )


@pytest.fixture
def down_url() -> str:
    """A URL with a password, on a loopback port where nothing listens."""
    return f"redis://pyrula:s3cret@127.0.0.1:{free_port()}"


def assert_one_line(text: str, *parts: str) -> None:
    assert "Traceback" not in text and "s3cret" not in text, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    for part in parts:
        assert part in lines[0], text


def masked(url: str) -> str:
    return url.replace(":s3cret@", ":***@")


@pytest.mark.parametrize("cluster", [False, True])
async def test_open_store_with_the_server_down(down_url: str, cluster: bool) -> None:
    url = f"{down_url}?namespace={fresh_namespace()}" + ("&cluster=true" if cluster else "")
    store = open_store(url)
    assert isinstance(store, ValkeyStore)
    for attempt in (store.open, store.list_runs):
        with pytest.raises(StoreUnavailable) as caught:
            await attempt()
        message = str(caught.value)
        assert message.startswith(f"cannot reach Valkey at {masked(down_url)}"), message
        assert "Is the server running" in message and ".." not in message
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
    await store.close()


async def test_wrong_credentials_and_wrong_urls_are_configuration_errors() -> None:
    server = ValkeyProcess()
    server.start()
    raw = server.client()
    try:
        raw.execute_command("ACL", "SETUSER", "pyrula", "on", ">right", "~*", "+@all")
        store = ValkeyStore(f"redis://pyrula:s3cret@127.0.0.1:{server.port}", shard_count=4)
        with pytest.raises(ConfigurationError, match="refused the credentials") as caught:
            await store.open()
        assert f"redis://pyrula:***@127.0.0.1:{server.port}" in str(caught.value)
        await store.close()
        single = ValkeyStore(f"redis://pyrula:right@127.0.0.1:{server.port}", cluster=True)
        with pytest.raises(ConfigurationError, match="is not a cluster"):
            await single.open()
        await single.close()
    finally:
        raw.close()
        server.cleanup()
    for url in ("redis://h:port", "redis://u:s3cret@h:99999"):
        with pytest.raises(ConfigurationError, match="invalid Valkey URL") as bad:
            ValkeyStore(url)  # at construction: nothing connects yet
        assert "s3cret" not in str(bad.value)


def test_runs_list_with_the_server_down(down_url: str) -> None:
    result = run_cli("runs", "list", "--store", f"{down_url}?namespace=x")
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert_one_line(result.stderr, f"Error: cannot reach Valkey at {masked(down_url)}")


def test_worker_with_the_server_down(down_url: str) -> None:
    # --no-retry-on-startup: exit at once (by default a worker retries, as Celery's does;
    # tests/integration/test_worker_health.py covers that).
    result = run_cli("worker", "--workflow", MODULE, "--store", down_url, "--no-retry-on-startup")
    assert result.returncode == 1, result
    assert_one_line(result.stderr, "failed: cannot reach Valkey at", masked(down_url))


@pytest.mark.slow
def test_worker_with_the_server_down_mid_run(tmp_path: Path) -> None:
    """The worker logs one WARNING line per failed attempt (no traceback), backs off, and
    serves again once the server is back."""
    server = ValkeyProcess(persist=True)
    server.start()
    url = f"{server.url}?namespace={fresh_namespace()}&shard_count=4"
    err = tmp_path / "worker.err"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [*pyrula_command(), "worker", "--workflow", MODULE, "--store", url,
             "--claim-poll-interval", "0.05", "--timer-poll-interval", "0.2"],
            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
        )  # fmt: skip
    client = WorkflowClient(ValkeyStore.from_url(url))
    try:
        assert client.submit("cli_add", {"a": 1, "b": 2}).result(timeout=30) == {
            "sum": 3,
            "doubled": 6,
        }
        server.stop()
        deadline = time.monotonic() + 20
        while "unavailable" not in err.read_text():
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.05)
        time.sleep(1.0)
        server.start()
        assert client.submit("cli_add", {"a": 2, "b": 2}).result(timeout=30) == {
            "sum": 4,
            "doubled": 8,
        }
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        log = err.read_text()
        assert "Traceback" not in log, log
        warnings = [line for line in log.splitlines() if " WARNING " in line]
        assert warnings and all(server.url in line for line in warnings), log
        assert "LOST ITS DATA" not in log  # the append-only file kept everything
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        server.cleanup()
