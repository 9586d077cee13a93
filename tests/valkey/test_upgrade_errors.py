"""upgrade_scripts(url) fails with pyrula's own errors, naming the URL and what to do:
a server that is down, a URL that can't work, wrong credentials, a missing ACL grant."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pyrula.workflows import ConfigurationError, StoreUnavailable
from pyrula.workflows.stores.valkey.functions import build_library, library, upgrade_scripts
from tests.valkey.servers import ValkeyProcess, free_port

STALE = build_library("-- a stale pyrula build\n")


@pytest.fixture(scope="module")
def acl_server() -> Iterator[ValkeyProcess]:
    """A server of this module's own (ACL users and libraries are server-wide)."""
    server = ValkeyProcess()
    server.start()
    raw = server.client()
    try:
        setuser = ("ACL", "SETUSER")
        raw.execute_command(*setuser, "deploy", "on", ">right", "%RW~_pyrula:*", "+@all")
        # Everything but the function commands.
        raw.execute_command(*setuser, "nofn", "on", ">pw", "%RW~_pyrula:*", "+@all", "-function")
        # May load and list, not delete.
        raw.execute_command(
            *setuser, "nodel", "on", ">pw", "%RW~_pyrula:*", "+@all", "-function",
            "+function|load", "+function|list",
        )  # fmt: skip
        # Every command, but only its own namespace's keys: no tombstone.
        raw.execute_command(*setuser, "nokey", "on", ">pw", "~staging:*", "+@all")
        yield server
    finally:
        raw.close()
        server.cleanup()


def url_of(server: ValkeyProcess, user: str, password: str) -> str:
    return f"redis://{user}:{password}@127.0.0.1:{server.port}"


def assert_clean(error: BaseException, url_part: str) -> str:
    """The message names the URL with its password masked; no driver error chained."""
    message = str(error)
    assert url_part in message, message
    assert error.__cause__ is None and error.__suppress_context__
    return message


@pytest.mark.parametrize("cluster", [False, True])
def test_a_server_that_is_down(cluster: bool) -> None:
    port = free_port()  # nothing listens here
    with pytest.raises(StoreUnavailable) as caught:
        upgrade_scripts(f"redis://deploy:s3cret@127.0.0.1:{port}", cluster=cluster)
    message = assert_clean(caught.value, f"redis://deploy:***@127.0.0.1:{port}")
    assert "cannot reach Valkey" in message and "s3cret" not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:6379", "http://127.0.0.1:6379"),
        ("redis://deploy:s3cret@127.0.0.1:port", "redis://deploy:***@127.0.0.1:port"),
    ],
)
def test_a_url_that_cannot_work(url: str, shown: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        upgrade_scripts(url)
    message = assert_clean(caught.value, shown)
    assert "invalid Valkey URL" in message and "s3cret" not in message


def test_wrong_credentials(acl_server: ValkeyProcess) -> None:
    url = url_of(acl_server, "deploy", "wrong")
    with pytest.raises(ConfigurationError) as caught:
        upgrade_scripts(url)
    message = assert_clean(caught.value, url_of(acl_server, "deploy", "***"))
    assert "refused the credentials" in message and "password" in message
    assert ":wrong@" not in message


def test_a_user_without_the_function_category(acl_server: ValkeyProcess) -> None:
    with pytest.raises(ConfigurationError) as caught:
        upgrade_scripts(url_of(acl_server, "nofn", "pw"))
    message = assert_clean(caught.value, url_of(acl_server, "nofn", "***"))
    assert "may not run FUNCTION LOAD" in message and "+function" in message


def test_a_user_that_may_not_delete_libraries(acl_server: ValkeyProcess) -> None:
    raw = acl_server.client()
    try:
        raw.execute_command("FUNCTION", "LOAD", "REPLACE", STALE.source)
        with pytest.raises(ConfigurationError) as caught:
            upgrade_scripts(url_of(acl_server, "nodel", "pw"), prune_stale=True)
        message = assert_clean(caught.value, url_of(acl_server, "nodel", "***"))
        assert "may not run FUNCTION DELETE" in message and "+function" in message
        # Loading alone needs no more than it has.
        assert upgrade_scripts(url_of(acl_server, "nodel", "pw"), prune_stale=False) == []
        # With the right grants the same call prunes.
        assert upgrade_scripts(url_of(acl_server, "deploy", "right")) == [STALE.name]
    finally:
        raw.close()


def test_a_user_without_the_tombstone_key(acl_server: ValkeyProcess) -> None:
    with pytest.raises(ConfigurationError) as caught:
        upgrade_scripts(url_of(acl_server, "nokey", "pw"))
    message = assert_clean(caught.value, url_of(acl_server, "nokey", "***"))
    assert "tombstone key _pyrula:{functions}:pruned_libraries" in message
    assert "%RW~_pyrula:*" in message


def test_cluster_true_on_a_single_node(acl_server: ValkeyProcess) -> None:
    with pytest.raises(ConfigurationError) as caught:
        upgrade_scripts(url_of(acl_server, "deploy", "right"), cluster=True)
    message = assert_clean(caught.value, url_of(acl_server, "deploy", "***"))
    assert "not a cluster" in message


def test_the_right_user_loads_the_library(acl_server: ValkeyProcess) -> None:
    assert upgrade_scripts(url_of(acl_server, "deploy", "right"), prune_stale=False) == []
    raw = acl_server.client()
    try:
        listing = raw.execute_command("FUNCTION", "LIST", "LIBRARYNAME", library().name)
        assert len(listing) == 1
    finally:
        raw.close()
