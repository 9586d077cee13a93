"""The Valkey pages hold up: examples/valkey_worker.py serves runs on a real valkey-server
and stops cleanly on SIGTERM; the ACL rules docs/valkey.md gives work as it says; the
option tables match the code; every python block compiles and every link resolves."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrula.workflows import ConfigurationError, RunStatus, ValkeyStore, WorkerOptions
from pyrula.workflows.stores.valkey.functions import build_library, library, upgrade_scripts
from pyrula.workflows.stores.valkey.keys import TOMBSTONE
from pyrula.workflows.sync import WorkflowClient
from tests.stores.helpers import TTL, create
from tests.valkey.servers import ValkeyProcess, fresh_namespace

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ("production-worker.md", "valkey.md", "capacity.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")
ORDER = {"order_id": "V-1", "sku": "tea", "quantity": 2, "amount_cents": 1250}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRULA_")}
    return {**env, **extra}


# -- examples/valkey_worker.py -------------------------------------------------------
@pytest.fixture(params=["--url", "PYRULA_STORE_URL"])
def example_worker(
    request: pytest.FixtureRequest, valkey_server: ValkeyProcess, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[bytes], ValkeyStore, Path]]:
    """``python -m examples.valkey_worker`` on the session's server, in a fresh namespace
    given the two documented ways; SIGKILLed by PID at teardown if still running."""
    namespace = fresh_namespace()
    if request.param == "--url":
        argv = ["--url", valkey_server.url]
        env = _env(PYRULA_VALKEY_NAMESPACE=namespace)
    else:
        argv = []
        env = _env(PYRULA_STORE_URL=f"{valkey_server.url}/0?namespace={namespace}")
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "examples.valkey_worker", *argv],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    store = ValkeyStore(valkey_server.url, namespace=namespace)
    try:
        yield proc, store, log_path
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.mark.slow
def test_the_valkey_worker_example_serves_runs_and_stops_on_sigterm(
    example_worker: tuple[subprocess.Popen[bytes], ValkeyStore, Path],
) -> None:
    proc, store, log_path = example_worker
    # Submit by name, as a web process that doesn't import the workflows would.
    client = WorkflowClient(store, require_registered=False)
    try:
        order = client.submit("examples.fulfil_order", ORDER, idempotency_key="order:V-1")
        report = client.submit("nightly_report", {"window": "1h"})
        order_result = order.result(timeout=60)
        report_result = report.result(timeout=60)
        record = order.record()
        schedule = store.schedule_get("nightly_report")
        log = log_path.read_text(errors="replace")
        assert order_result["label"] == "label:V-1:res-tea-2", log
        assert report_result == {"window": "1h", "orders": 42}, log
        assert record.worker_id is not None and f"-{proc.pid}-" in record.worker_id
        assert schedule is not None and schedule.cron == "0 2 * * *", log
        assert schedule.workflow == "nightly_report" and schedule.params == '{"window":"24h"}'
        held = asyncio.run(store.shard_holders())
        assert set(held.values()) == {record.worker_id}, held  # alone: every shard

        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text(errors="replace")
        # A clean stop: its shard leases released at once, its worker entry removed.
        held = asyncio.run(store.shard_holders())
        assert record.worker_id not in held.values(), held
        assert asyncio.run(store.list_workers()) == []
        assert asyncio.run(store.list_runs(status=RunStatus.RUNNING)) == []
    finally:
        client.close()


# -- the ACL rules of docs/valkey.md --------------------------------------------------
def _acl_rules(user: str) -> list[str]:
    """The rules after ``ACL SETUSER <user>`` in docs/valkey.md."""
    text = (DOCS / "valkey.md").read_text()
    found = re.search(rf"^ACL SETUSER {user} (.+)$", text, re.MULTILINE)
    assert found, f"docs/valkey.md has no 'ACL SETUSER {user}' line"
    return found.group(1).split()


def _with_password(rules: list[str]) -> list[str]:
    return ["reset", *[">pw" if rule.startswith(">") else rule for rule in rules]]


async def test_the_documented_acls_work_as_the_page_says(own_server: ValkeyProcess) -> None:
    admin = own_server.client()
    try:
        for user in ("pyrula-staging", "pyrula-deploy"):
            admin.execute_command("ACL", "SETUSER", user, *_with_password(_acl_rules(user)))
        staging = ValkeyStore(
            f"redis://pyrula-staging:pw@127.0.0.1:{own_server.port}",
            namespace="staging",
            shard_count=4,
        )
        try:
            await staging.open()  # FUNCTION LOAD, TIME, INFO, the tombstone check
            run_id = await create(staging)
            [lease] = await staging.claim_runs("w", ["wf"], 1, TTL)
            assert lease.run_id == run_id
            assert await staging.lease_shards("w")
        finally:
            await staging.close()

        def denied(*command: str) -> bool:
            reply = admin.execute_command("ACL", "DRYRUN", "pyrula-staging", *command)
            return bool(reply != b"OK")

        assert denied("FUNCTION", "DELETE", library().name)
        assert denied("FUNCTION", "FLUSH")
        assert denied("FLUSHALL")
        assert denied("GET", "production:{production:meta}:m")
        assert denied("SADD", TOMBSTONE, "x")
        assert not denied("SISMEMBER", TOMBSTONE, "x")

        # The deploy user prunes an older build and records it in the tombstone.
        old = build_library("-- an older build\n")
        admin.execute_command("FUNCTION", "LOAD", old.source)
        deploy_url = f"redis://pyrula-deploy:pw@127.0.0.1:{own_server.port}"
        assert upgrade_scripts(deploy_url, prune_stale=True) == [old.name]
        assert admin.sismember(TOMBSTONE, old.name)
        # The worker's credentials cannot prune, and the error says what they lack.
        with pytest.raises(ConfigurationError, match="may not read or write the tombstone"):
            upgrade_scripts(
                f"redis://pyrula-staging:pw@127.0.0.1:{own_server.port}", prune_stale=True
            )
    finally:
        admin.close()


# -- tables that must match the code --------------------------------------------------
def _table(page: str, heading: str) -> dict[str, str]:
    """First two columns (backticks stripped) of the first table under ``heading``."""
    text = (DOCS / page).read_text()
    start = text.index(heading)
    rows: dict[str, str] = {}
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
            if cells[0] not in ("field", "argument") and not set(cells[0]) <= {"-"}:
                rows[cells[0]] = cells[1]
        elif rows:
            break
    return rows


def test_every_worker_option_and_default_is_on_the_production_page() -> None:
    rows = _table("production-worker.md", "### Every WorkerOptions field")
    defaults = {f.name: f.default for f in dataclasses.fields(WorkerOptions)}
    assert set(rows) == set(defaults)
    for name, default in defaults.items():
        assert ast.literal_eval(rows[name]) == default, (name, rows[name], default)


def test_the_valkey_store_arguments_table_matches_the_constructor() -> None:
    rows = _table("valkey.md", "## Constructor")
    params = inspect.signature(ValkeyStore).parameters
    assert set(rows) == set(params)
    for name, param in params.items():
        assert ast.literal_eval(rows[name]) == param.default, (name, rows[name])


def test_the_pages_are_linked_from_the_index_and_the_stores_page() -> None:
    index = (DOCS / "index.md").read_text()
    for name in PAGES:
        assert f"]({name}" in index, f"docs/index.md does not link {name}"
    assert "](valkey.md" in (DOCS / "stores.md").read_text()
    assert "examples/valkey_worker.py" in (DOCS / "production-worker.md").read_text()
