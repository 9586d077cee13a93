"""The Lua function library: its source, its content-addressed name, loading and pruning.

Every atomic operation of ValkeyStore is a function of one library, assembled from the
``lua/*.lua`` files of this package (plus the key helpers :mod:`.keys` generates) and
loaded with ``FUNCTION LOAD`` under ``pyrula_<hash of the source>``; each function is
named ``<library>_<name>``. Two builds therefore load two libraries side by side and each
keeps calling its own during a rolling deploy. Nothing removes old libraries except
:func:`upgrade_scripts` with ``prune_stale=True``, which records what it removed in the
server-wide tombstone set ``_pyrula:{functions}:pruned_libraries``: a store whose library
was pruned fails with StoreUnavailable instead of loading it back.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from valkey import exceptions as vex

from pyrula.workflows.errors import (
    ConfigurationError,
    PyrulaError,
    StoreError,
    StoreUnavailable,
)
from pyrula.workflows.stores.flow import CLAIM_SHARE, RATE_SKIP_WINDOW, TOKEN_SLACK
from pyrula.workflows.stores.valkey.clients import close_quietly, mask_url
from pyrula.workflows.stores.valkey.codec import FINISH_FIELDS
from pyrula.workflows.stores.valkey.keys import TOMBSTONE, lua_prelude

log = logging.getLogger(__name__)

LUA_FILES = (
    "common.lua",
    "runs.lua",
    "claims.lua",
    "claim_due.lua",
    "leases.lua",
    "admin.lua",
    "flow.lua",
    "events.lua",
    "purge.lua",
)
"""Concatenated in this order into one chunk, so later files see common.lua's helpers."""
LIBRARY_PREFIX = "pyrula_"


@dataclass(frozen=True)
class Library:
    name: str
    source: str

    def function(self, name: str) -> str:
        return f"{self.name}_{name}"


@functools.lru_cache(maxsize=1)
def library() -> Library:
    """This build's library: its name is derived from a hash of its source."""
    return build_library()


def build_library(extra: str = "") -> Library:
    """The library from this package's Lua files (plus ``extra`` source: tests build a
    second "build" this way)."""
    package = resources.files("pyrula.workflows.stores.valkey") / "lua"
    body = (
        extra
        + lua_prelude()
        + "".join(
            f"\n-- ==== {name} ====\n" + (package / name).read_text(encoding="utf-8")
            for name in LUA_FILES
        )
    )
    # Constants shared with Python, so the Lua never spells them a second time.
    constants = {
        "TOKEN_SLACK": TOKEN_SLACK,
        "RATE_SKIP_WINDOW": RATE_SKIP_WINDOW,
        "CLAIM_SHARE": CLAIM_SHARE,
        "FINISH_FIELDS": FINISH_FIELDS,
    }
    body = "".join(f"local {k} = {v!r}\n" for k, v in constants.items()) + body
    name = LIBRARY_PREFIX + hashlib.sha256(body.encode()).hexdigest()[:16]
    source = f"#!lua name={name}\nlocal LIBRARY = {name!r}\n{body}"
    return Library(name=name, source=source)


def is_function_missing(exc: BaseException) -> bool:
    return "function not found" in str(exc).lower()


def is_already_loaded(exc: BaseException) -> bool:
    return "already exists" in str(exc).lower()


def _primaries(client: Any, cluster: bool) -> list[Any]:
    """Targets for per-node commands: each primary of a cluster, else the one server."""
    return list(client.get_primaries()) if cluster else [None]


def _on(client: Any, node: Any, *args: Any) -> Any:
    return (
        client.execute_command(*args)
        if node is None
        else client.execute_command(*args, target_nodes=node)
    )


async def load_library(client: Any, cluster: bool, lib: Library) -> None:
    """Load ``lib`` on every primary (already loaded is fine)."""
    for node in _primaries(client, cluster):
        try:
            await _on(client, node, "FUNCTION", "LOAD", lib.source)
        except Exception as exc:
            if not is_already_loaded(exc):
                raise


async def check_not_pruned(client: Any, url: str, lib: Library) -> None:
    if await client.sismember(TOMBSTONE, lib.name):
        raise StoreUnavailable(
            f"the Valkey function library {lib.name} of this pyrula build was pruned from "
            f"{url} by upgrade_scripts(prune_stale=True): this process runs an old build; "
            "restart it on the current one"
        )


ADMIN_TIMEOUT = 10.0
"""Seconds upgrade_scripts waits to connect, and for any one reply."""
_NO_COMMAND = re.compile(r"no permissions to run the '([^']+)' command", re.I)


def admin_error(exc: BaseException, url: str, cluster: bool) -> PyrulaError:
    """The pyrula error, naming ``url`` and what to do, for a driver error of
    :func:`upgrade_scripts`."""
    text = str(exc).rstrip(".")
    if isinstance(exc, vex.AuthenticationError):
        return ConfigurationError(
            f"Valkey at {url} refused the credentials: {text}. Check the user name and "
            "password in the URL (redis://user:password@host:port)"
        )
    if isinstance(exc, vex.NoPermissionError):
        denied = _NO_COMMAND.search(text)
        what = (
            f"may not run {denied.group(1).upper().replace('|', ' ')}"
            if denied
            else f"may not read or write the tombstone key {TOMBSTONE}"
        )
        return ConfigurationError(
            f"the Valkey user of {url} {what} ({text}). upgrade_scripts needs the "
            "+function ACL category (FUNCTION LOAD, LIST and DELETE) and read-write "
            "access to the tombstone, e.g. ACL SETUSER <user> +function +sadd +srem "
            "+sismember %RW~_pyrula:* (see the ACLs section of docs/valkey.md)"
        )
    if isinstance(exc, vex.MovedError):
        return ConfigurationError(
            f"Valkey at {url} is a cluster node (it answered MOVED): call "
            "upgrade_scripts(url, cluster=True)"
        )
    if "cluster mode is not enabled" in text.lower() or "cluster support disabled" in text:
        return ConfigurationError(
            f"Valkey at {url} is not a cluster: call upgrade_scripts without cluster=True"
        )
    unreachable = (
        vex.ConnectionError,
        vex.TimeoutError,
        vex.ValkeyClusterException,
        vex.ClusterError,
        OSError,
    )
    if isinstance(exc, unreachable):
        return StoreUnavailable(
            f"cannot reach Valkey at {url}: {text}. Is the server running, and is the URL right?"
        )
    if text.startswith(("LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")):
        return StoreUnavailable(f"Valkey at {url} is unavailable: {text}")
    kind = "cluster" if cluster else "server"
    return StoreError(f"Valkey {kind} at {url} refused upgrade_scripts: {text}")


def upgrade_scripts(url: str, prune_stale: bool = True, *, cluster: bool = False) -> list[str]:
    """Load this build's library on ``url`` (every primary of a cluster); with
    ``prune_stale``, delete every other ``pyrula_*`` library and record it in the
    tombstone so workers still running that build fail loudly instead of reloading it.

    Run it once no worker of an older build is running. Needs the ``+function`` ACL
    category and access to the tombstone key. Returns the names it removed.

    Raises StoreUnavailable when the server can't be reached, ConfigurationError for a
    URL, credentials or ACL that can't work (the message names the URL and what is
    missing), StoreError for anything else the server refused.
    """
    from pyrula.workflows.stores.schedule_admin import run_blocking

    return run_blocking(lambda: _upgrade(url, prune_stale, cluster))


def prune_stale_function_libraries(url: str, *, cluster: bool = False) -> list[str]:
    """``upgrade_scripts(url, prune_stale=True)``: load this build's library and delete
    every other build's, recording them in the tombstone. The one call a deploy job
    needs the ``+function`` ACL category for; returns the names it removed."""
    return upgrade_scripts(url, prune_stale=True, cluster=cluster)


async def _upgrade(url: str, prune_stale: bool, cluster: bool) -> list[str]:
    import valkey.asyncio as valkey_async
    from valkey.asyncio.cluster import ValkeyCluster

    masked = mask_url(url)
    options: dict[str, Any] = {
        "socket_timeout": ADMIN_TIMEOUT,
        "socket_connect_timeout": ADMIN_TIMEOUT,
    }
    try:
        client: Any = (
            ValkeyCluster.from_url(url, **options)
            if cluster
            else valkey_async.Valkey.from_url(url, **options)
        )
    except ValueError as exc:  # valkey-py's URL parsing
        raise ConfigurationError(f"invalid Valkey URL {masked!r}: {exc}") from None
    try:
        return await _prune(client, prune_stale, cluster)
    except PyrulaError:
        raise
    except Exception as exc:
        raise admin_error(exc, masked, cluster) from None
    finally:
        await close_quietly(client)


async def _prune(client: Any, prune_stale: bool, cluster: bool) -> list[str]:
    lib = library()
    pruned: set[str] = set()
    await client.srem(TOMBSTONE, lib.name)  # loading it again on purpose revives it
    await load_library(client, cluster, lib)
    if prune_stale:
        for node in _primaries(client, cluster):
            listing = await _on(
                client, node, "FUNCTION", "LIST", "LIBRARYNAME", LIBRARY_PREFIX + "*"
            )
            for entry in listing:
                fields = dict(zip(entry[::2], entry[1::2], strict=False))
                name = fields[b"library_name"].decode()
                if name.startswith(LIBRARY_PREFIX) and name != lib.name:
                    await client.sadd(TOMBSTONE, name)  # first: never a silent reload
                    await _on(client, node, "FUNCTION", "DELETE", name)
                    pruned.add(name)
    if pruned:
        log.warning("pruned Valkey function libraries %s", ", ".join(sorted(pruned)))
    return sorted(pruned)
