"""reliability.md §4 item 3: crafted data in a run record is never executed.

An attacker with write access to the store plants values in a run record (through the
store's own API, which takes raw text, or with raw HSETs on Valkey): a pickle blob whose
``__reduce__`` creates a canary file, and error JSON naming a callable or a module with
side effects. Every reader a user has then reads the record back: ``RunHandle.record()``
and ``.result()`` (async, and the sync client), ``pyrula runs show`` and pyrula_compat's
``AsyncResult``; the worker replays a journal holding crafted values. None may create the
canary, call what the data names, or import a module that was not imported.

Each test fails if a reader unpickles (the canary file appears), calls a named callable
(the canary file appears), imports a named module (``sys.modules`` grows, canary
appears), or answers crafted data with something other than what is asserted (an error that is
not an error record is a ValueError to the readers, and shown raw by ``runs show``).
"""

from __future__ import annotations

import json
import pickle
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import valkey
from click.testing import CliRunner

from pyrula.cli.main import cli
from pyrula.workflows import (
    DurableInvocationError,
    PyrulaError,
    RunStatus,
    Store,
    open_store,
    step,
    workflow,
)
from pyrula.workflows.client import RunHandle
from pyrula.workflows.records import JournalEntry, NewRun, Outcome
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.valkey.keys import Keys
from pyrula.workflows.sync import WorkflowClient as SyncClient
from tests.conftest import StartWorker
from tests.valkey.servers import ValkeyProcess, fresh_namespace, valkey_server  # noqa: F401

KINDS = ("sqlite", "valkey")


class Canary:
    """Unpickling this creates ``path`` (``open(path, "w")``): the proof of execution."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


@pytest.fixture(params=KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'crafted.db'}"
    server: ValkeyProcess = request.getfixturevalue("valkey_server")
    return f"{server.url}/0?namespace={fresh_namespace()}"


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "canary"
    yield path
    assert not path.exists(), "crafted store data was executed: the canary file exists"


def pickle_text(path: Path) -> str:
    """A pickle blob as the text a store holds (latin-1 keeps every byte)."""
    return pickle.dumps(Canary(path)).decode("latin-1")


async def plant(url: str, params: str, outcome: Outcome) -> str:
    """A run of a workflow of its own, created with ``params`` and ended with ``outcome``."""
    store = open_store(url)
    await store.open()
    try:
        name = "crafted_" + uuid.uuid4().hex[:8]
        run_id = "run-" + uuid.uuid4().hex[:8]
        await store.create_run(NewRun(run_id=run_id, workflow=name, params=params))
        (lease,) = await store.claim_runs("attacker", [name], 1, 60.0)
        await store.finish_run(run_id, lease.token, outcome)
        return run_id
    finally:
        await store.close()


async def async_result(url: str, run_id: str) -> BaseException | Any:
    store = open_store(url)
    await store.open()
    try:
        handle = RunHandle(store, "any", run_id)
        try:
            assert (await handle.record()).run_id == run_id  # raw text, or a decoding error
            return await handle.result(timeout=5)
        except Exception as exc:
            return exc
    finally:
        await store.close()


def sync_result(url: str, run_id: str) -> BaseException | Any:
    with SyncClient(open_store(url), require_registered=False) as client:
        handle = client.handle("any", run_id)
        try:
            assert handle.record().run_id == run_id
            return handle.result(timeout=5)
        except Exception as exc:
            return exc


def cli_show(url: str, run_id: str, *flags: str) -> Any:
    """In a thread of its own: the command runs its own event loop."""
    args = ["runs", "show", run_id, "--store", url, *flags]
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(CliRunner().invoke, cli, args).result()


def compat_reads(url: str, run_id: str) -> dict[str, Any]:
    """What each AsyncResult reader gives: its value, or the exception it raised."""
    from pyrula_compat import Celery

    app = Celery("crafted", broker=url, set_as_current=False)
    result = app.AsyncResult(run_id)
    seen: dict[str, Any] = {}
    readers: dict[str, Callable[[], Any]] = {
        "state": lambda: result.state,
        "result": lambda: result.result,
        "traceback": lambda: result.traceback,
        "get": lambda: result.get(timeout=5),
    }
    for what, read in readers.items():
        try:
            seen[what] = read()
        except Exception as exc:
            seen[what] = exc
    return seen


# -- (a) pickle blobs ------------------------------------------------------------------
async def test_a_pickle_blob_in_params_result_and_error_is_never_unpickled(
    store_url: str, canary: Path
) -> None:
    blob = pickle_text(canary)
    done = await plant(store_url, blob, Outcome(RunStatus.COMPLETED, result=blob))
    failed = await plant(store_url, blob, Outcome(RunStatus.FAILED, error=blob))
    for run_id in (done, failed):
        # a clear decoding error (json.JSONDecodeError is a ValueError), never a value
        assert isinstance(await async_result(store_url, run_id), ValueError)
        assert isinstance(sync_result(store_url, run_id), ValueError)
        for flags in ((), ("--json",)):
            cli_show(store_url, run_id, *flags)
        seen = compat_reads(store_url, run_id)
        assert isinstance(seen["get"], ValueError), seen
        assert not canary.exists()
    assert compat_reads(store_url, done)["state"] == "SUCCESS"
    assert compat_reads(store_url, failed)["state"] == "FAILURE"
    shown = cli_show(store_url, done, "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["run"]["params"] == blob  # shown as text, not loaded


async def test_raw_pickle_bytes_in_a_valkey_run_hash_are_never_unpickled(
    valkey_server: ValkeyProcess,  # noqa: F811
    canary: Path,
) -> None:
    """Bytes that are not UTF-8 (pickle protocol 5 starts with 0x80) in the hash fields
    of params (``p``), result (``rs``) and error (``er``), set with HSET."""
    namespace = fresh_namespace()
    url = f"{valkey_server.url}/0?namespace={namespace}"
    run_id = await plant(url, "{}", Outcome(RunStatus.COMPLETED, result="1"))
    raw = pickle.dumps(Canary(canary), protocol=5)
    client = valkey.Valkey(port=valkey_server.port)
    try:
        key = Keys(namespace, 64).run(run_id)
        assert client.hget(key, "wf") is not None, f"no run hash at {key}"
        client.hset(key, mapping={"p": raw, "rs": raw, "er": raw})
    finally:
        client.close()
    assert isinstance(await async_result(url, run_id), ValueError)  # UnicodeDecodeError
    assert isinstance(sync_result(url, run_id), ValueError)
    cli_show(url, run_id, "--json")
    compat_reads(url, run_id)
    assert not canary.exists()


# -- (b) error JSON naming something with side effects ---------------------------------
def naming(module: str, name: str, args: list[Any]) -> str:
    return json.dumps(
        {"module": module, "type": name, "message": "crafted", "traceback": "tb", "args": args}
    )


async def test_an_error_naming_a_callable_is_never_called(store_url: str, canary: Path) -> None:
    crafted = {
        "os.system": naming("os", "system", [f"touch {canary}"]),
        "builtins.open": naming("builtins", "open", [str(canary), "w"]),
        "pathlib.Path.touch": naming("pathlib", "Path.touch", [str(canary)]),
        "subprocess.run": naming("subprocess", "run", [["touch", str(canary)]]),
    }
    for qualified, error in crafted.items():
        run_id = await plant(store_url, "{}", Outcome(RunStatus.FAILED, error=error))
        for got in (await async_result(store_url, run_id), sync_result(store_url, run_id)):
            assert isinstance(got, DurableInvocationError), got
            assert got.error_type == qualified
            assert got.original is None  # not an exception class: nothing rebuilt
        shown = cli_show(store_url, run_id, "--json")
        assert shown.exit_code == 0, shown.output
        assert json.loads(shown.output)["run"]["error"]["type"] == qualified
        seen = compat_reads(store_url, run_id)
        assert seen["state"] == "FAILURE"
        for what in ("get", "result"):
            # a stand-in Exception class carrying the name, never the named callable
            assert isinstance(seen[what], Exception), (what, seen[what])
            assert f"{type(seen[what]).__module__}.{type(seen[what]).__qualname__}" == qualified
        assert not canary.exists(), qualified


@pytest.fixture
def side_effect_module(tmp_path: Path, canary: Path) -> Iterator[str]:
    """A module on sys.path, not imported, that creates the canary when imported."""
    name = "pyrula_crafted_" + uuid.uuid4().hex[:10]
    (tmp_path / f"{name}.py").write_text(
        f"open({str(canary)!r}, 'w').close()\n\nclass Boom(Exception):\n    pass\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
        canary.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "reader",
    [
        pytest.param("handle.result"),
        pytest.param("sync.result"),
        pytest.param("compat.get"),
        pytest.param("compat.state"),
        pytest.param("cli.show"),
    ],
)
async def test_an_error_naming_an_unimported_module_does_not_import_it(
    store_url: str, canary: Path, side_effect_module: str, reader: str
) -> None:
    error = naming(side_effect_module, "Boom", ["crafted"])
    run_id = await plant(store_url, "{}", Outcome(RunStatus.FAILED, error=error))
    assert side_effect_module not in sys.modules
    if reader == "handle.result":
        got = await async_result(store_url, run_id)
    elif reader == "sync.result":
        got = sync_result(store_url, run_id)
    elif reader == "cli.show":
        got = cli_show(store_url, run_id, "--json")
        assert got.exit_code == 0, got.output
    else:
        from pyrula_compat import Celery

        result = Celery("crafted", broker=store_url, set_as_current=False).AsyncResult(run_id)
        if reader == "compat.state":
            got = result.state
        else:
            with pytest.raises(Exception) as caught:
                result.get(timeout=5)
            got = caught.value
    assert side_effect_module not in sys.modules, f"{reader} imported it ({got!r})"
    assert not canary.exists(), f"{reader} ran the module's code"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param("not json {", id="not-json"),
        pytest.param("[1, 2]", id="list"),
        pytest.param('"text"', id="string"),
        pytest.param("null", id="null"),
    ],
)
async def test_an_error_that_is_not_an_error_object_reads_as_a_clear_error(
    store_url: str, error: str
) -> None:
    """Expected: a ValueError (a decoding error) or a PyrulaError, nothing else."""
    run_id = await plant(store_url, "{}", Outcome(RunStatus.FAILED, error=error))
    got = await async_result(store_url, run_id)
    assert isinstance(got, (ValueError, PyrulaError)), repr(got)
    seen = compat_reads(store_url, run_id)
    assert isinstance(seen["get"], (ValueError, PyrulaError)), repr(seen["get"])


async def test_runs_show_reports_an_unreadable_error_as_a_cli_error(
    store_url: str, canary: Path
) -> None:
    run_id = await plant(store_url, "{}", Outcome(RunStatus.FAILED, error=pickle_text(canary)))
    for flags in ((), ("--json",)):
        shown = cli_show(store_url, run_id, *flags)
        assert shown.exception is None or isinstance(shown.exception, SystemExit), repr(
            shown.exception
        )


# -- replay of a crafted journal -------------------------------------------------------
async def test_the_worker_replaying_a_crafted_journal_executes_nothing(
    store_url: str, canary: Path, registry: Registry, start_worker: StartWorker
) -> None:
    """Position 0 holds a pickle blob as a step result; position 1 a step error naming
    ``os.system``. The replay must not unpickle or call either, and the run must end."""
    calls: list[str] = []

    @step(name="first")
    async def first() -> int:
        calls.append("first")
        return 1

    @step(name="second")
    async def second() -> int:
        calls.append("second")
        return 2

    name = "replayed_" + uuid.uuid4().hex[:8]

    @workflow(name=name, registry=registry)
    async def replayed(ctx: Any) -> str:
        try:
            await first()
        except Exception as exc:
            return f"first: {type(exc).__name__}"
        try:
            await second()
        except Exception as exc:
            return f"second: {type(exc).__module__}.{type(exc).__qualname__}"
        return "no error"

    store: Store = open_store(store_url)
    await store.open()
    try:
        run_id = "run-" + uuid.uuid4().hex[:8]
        await store.create_run(NewRun(run_id=run_id, workflow=name, params="{}"))
        (lease,) = await store.claim_runs("attacker", [name], 1, 60.0)
        crafted = [
            JournalEntry(run_id, 0, "step", "first", True, pickle_text(canary)),
            JournalEntry(run_id, 1, "step", "second", False, naming("os", "system", ["x"])),
        ]
        for entry in crafted:
            await store.append_journal(lease.token, entry)
        await store.release_run(run_id, lease.token)
        await start_worker(store, [replayed])
        ended = await store.wait_run(run_id, timeout=10)
        assert ended.is_terminal, ended.status
        assert not canary.exists()
        assert calls == []  # replayed from the journal, not run again
        # The blob is not JSON: the replay fails the run or raises into the workflow.
        if ended.status is RunStatus.COMPLETED:
            assert json.loads(ended.result or "null").startswith("first: "), ended.result
        else:
            assert ended.status is RunStatus.FAILED, ended.status
    finally:
        await store.close()
