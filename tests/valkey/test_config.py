"""ValkeyStore settings, URLs and start-up checks: bad input is refused early and clearly."""

from __future__ import annotations

import pytest

from pyrula.workflows import (
    ConfigurationError,
    StoreUnavailable,
    WorkerOptions,
    WorkflowWorker,
    open_store,
)
from pyrula.workflows.stores.valkey import ValkeyStore
from pyrula.workflows.stores.valkey.clients import mask_url
from pyrula.workflows.stores.valkey.keys import TOMBSTONE, Keys
from tests.valkey.servers import ValkeyProcess, free_port, fresh_namespace

from .conftest import MakeStore


@pytest.mark.parametrize(
    "namespace",
    ["", "Staging", "a:b", "a{b}", "_pyrula", "-x", "has space", "ü", "x" * 65, "a.b"],
)
def test_bad_namespaces_are_refused(namespace: str) -> None:
    with pytest.raises(ConfigurationError, match="namespace"):
        ValkeyStore("redis://127.0.0.1:1", namespace=namespace)


@pytest.mark.parametrize("namespace", ["default", "run", "meta", "cache", "a", "x-1_y", "9"])
def test_namespaces_equal_to_key_families_are_fine(namespace: str) -> None:
    store = ValkeyStore("redis://127.0.0.1:1", namespace=namespace)
    assert store.namespace == namespace


def test_no_two_namespaces_share_a_key() -> None:
    """A key's namespace is the text before its first ':', whatever the names."""
    names = ["a", "a-b", "ab", "run", "r", "meta", "default"]
    for ns in names:
        keys = Keys(ns, 4)
        spelled = [
            keys.run("x"), keys.journal("run:x"), keys.signal("a:b", "c"), keys.meta,
            keys.workers, keys.hint("wf"), keys.timer_hint, keys.sched, keys.flow,
            keys.leases, keys.concurrency("wf", "o"), keys.idem("k"), keys.done("r"),
        ]  # fmt: skip
        assert all(key.split(":", 1)[0] == ns for key in spelled), spelled
    assert TOMBSTONE.split(":", 1)[0] == "_pyrula"


def test_namespace_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYRULA_VALKEY_NAMESPACE", raising=False)
    assert ValkeyStore("redis://127.0.0.1:1").namespace == "default"
    monkeypatch.setenv("PYRULA_VALKEY_NAMESPACE", "staging")
    assert ValkeyStore("redis://127.0.0.1:1").namespace == "staging"
    assert ValkeyStore("redis://127.0.0.1:1", namespace="prod").namespace == "prod"
    monkeypatch.setenv("PYRULA_VALKEY_NAMESPACE", "Bad:Name")
    with pytest.raises(ConfigurationError):
        ValkeyStore("redis://127.0.0.1:1")


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "64"])
def test_bad_shard_counts(count: object) -> None:
    with pytest.raises(ConfigurationError, match="shard_count"):
        ValkeyStore("redis://127.0.0.1:1", shard_count=count)  # type: ignore[arg-type]


@pytest.mark.parametrize(("ttl", "interval"), [(30, 30), (10, 20), (5, 0), (0, 0)])
def test_lease_interval_must_be_shorter_than_its_ttl(ttl: float, interval: float) -> None:
    with pytest.raises(ConfigurationError, match="shard_lease"):
        ValkeyStore("redis://127.0.0.1:1", shard_lease_ttl=ttl, shard_lease_interval=interval)


@pytest.mark.parametrize("interval", [30.0, 45.0])
def test_a_worker_lease_interval_not_shorter_than_the_ttl_is_refused(interval: float) -> None:
    store = ValkeyStore("redis://127.0.0.1:1", shard_lease_ttl=30)
    with pytest.raises(ConfigurationError, match=r"shard_lease_interval .* shorter"):
        WorkflowWorker(
            store=store, workflows=[], options=WorkerOptions(shard_lease_interval=interval)
        )
    # The default fits the default TTL; with a store given a shorter TTL, its own interval.
    WorkflowWorker(store=store, workflows=[], options=WorkerOptions())
    short = ValkeyStore("redis://127.0.0.1:1", shard_lease_ttl=2, shard_lease_interval=0.5)
    WorkflowWorker(store=short, workflows=[], options=WorkerOptions())


def test_defaults() -> None:
    store = ValkeyStore()
    assert (store.shard_count, store.cluster) == (64, False)
    assert (store.shard_lease_ttl, store.shard_lease_interval) == (30.0, 10.0)


@pytest.mark.parametrize("scheme", ["redis", "rediss", "valkey", "valkeys"])
def test_open_store_maps_valkey_urls(scheme: str) -> None:
    store = open_store(f"{scheme}://127.0.0.1:6390/0?namespace=staging&shard_count=8")
    assert isinstance(store, ValkeyStore)
    assert store.namespace == "staging" and store.shard_count == 8
    assert store.url == f"{scheme}://127.0.0.1:6390/0"


def test_open_store_unix_socket_and_cluster_options() -> None:
    store = open_store("unix:///tmp/valkey.sock?namespace=n1")
    assert isinstance(store, ValkeyStore) and store.namespace == "n1"
    store = open_store(
        "redis://h:1?cluster=true&shard_lease_ttl=9&shard_lease_interval=3&socket_timeout=4"
    )
    assert isinstance(store, ValkeyStore) and store.cluster
    assert (store.shard_lease_ttl, store.shard_lease_interval) == (9.0, 3.0)
    with pytest.raises(ConfigurationError, match="shard_count"):
        open_store("redis://h:1?shard_count=many")


def test_a_misspelt_url_option_is_refused_at_construction_with_a_suggestion() -> None:
    # valkey-py would hand it to the connection, failing only at connect time, as if
    # the server were unreachable.
    for make in (ValkeyStore, open_store):
        with pytest.raises(ConfigurationError, match=r"unknown option 'namespce'.*'namespace'"):
            make("redis://:s3cret@127.0.0.1:6390/0?namespce=staging")
    with pytest.raises(ConfigurationError, match="unknown option 'bogus'") as caught:
        open_store("redis://:s3cret@127.0.0.1:6390/0?bogus=1&cluster=true")
    assert "s3cret" not in str(caught.value)


def test_store_options_in_a_url_given_to_the_store_itself_say_where_they_go() -> None:
    with pytest.raises(ConfigurationError, match=r"store option: pass namespace=\.\.\. to"):
        ValkeyStore("redis://127.0.0.1:6390/0?namespace=staging")
    with pytest.raises(ConfigurationError, match="decodes replies itself"):
        open_store("redis://127.0.0.1:6390/0?decode_responses=true")


@pytest.mark.parametrize(
    "url",
    [
        "redis://h:1/2?client_name=api&health_check_interval=30&socket_keepalive=yes",
        "rediss://h:1/0?ssl_cert_reqs=none&ssl_check_hostname=false",
        "unix:///tmp/valkey.sock?db=3&max_connections=20",
    ],
)
def test_connection_options_in_a_url_are_accepted(url: str) -> None:
    assert ValkeyStore(url).url == url
    assert open_store(url + "&namespace=n1").namespace == "n1"  # type: ignore[attr-defined]


def test_passwords_are_masked() -> None:
    url = "redis://user:s3cret@127.0.0.1:6379/0"
    assert mask_url(url) == "redis://user:***@127.0.0.1:6379/0"
    assert mask_url("redis://:s3cret@h:1") == "redis://:***@h:1"
    store = ValkeyStore(url)
    assert "s3cret" not in store.url and "s3cret" not in repr(store)


async def test_server_down_at_start_names_the_url() -> None:
    port = free_port()  # nothing listens here
    store = ValkeyStore(f"redis://user:s3cret@127.0.0.1:{port}", namespace=fresh_namespace())
    with pytest.raises(StoreUnavailable) as caught:
        await store.open()
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message and "***" in message and "s3cret" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(StoreUnavailable):  # any operation opens first, the same way
        await store.get_run("r1")
    await store.close()


@pytest.mark.parametrize("user", ["default", "pyrula-staging"])
async def test_an_evicting_server_is_refused(user: str) -> None:
    """Also for the worker user docs/valkey.md recommends, which may not run CONFIG GET
    (``-@dangerous``): the policy is read from ``INFO memory``."""
    server = ValkeyProcess("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru")
    server.start()
    try:
        url = server.url
        if user != "default":
            rules = "~* +@read +@write +@scripting +@connection -@dangerous +info"
            admin = server.client()
            admin.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", *rules.split())
            admin.close()
            url = f"redis://{user}:pw@127.0.0.1:{server.port}"
        store = ValkeyStore(url, namespace=fresh_namespace())
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            await store.open()
        await store.close()
    finally:
        server.cleanup()


async def test_shard_count_mismatch_is_refused(make_store: MakeStore, topology: str) -> None:
    first = await make_store(topology, shard_count=8)
    with pytest.raises(ConfigurationError, match="shard_count=8"):
        await make_store(topology, namespace=first.namespace, shard_count=16)
    same = await make_store(topology, namespace=first.namespace, shard_count=8)
    assert same.shard_count == 8
    # Another namespace on the same server may pick its own count.
    await make_store(topology, shard_count=16)
