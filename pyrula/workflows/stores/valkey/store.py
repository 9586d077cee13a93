"""ValkeyStore: the production store, on one Valkey server or a Valkey cluster."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from valkey import exceptions as vex

from pyrula.workflows.errors import ConfigurationError, StoreError
from pyrula.workflows.stores.notify import Notifier
from pyrula.workflows.stores.schedule_admin import ScheduleAdmin
from pyrula.workflows.stores.valkey import functions
from pyrula.workflows.stores.valkey.clients import mask_url
from pyrula.workflows.stores.valkey.codec import text
from pyrula.workflows.stores.valkey.connection import Server
from pyrula.workflows.stores.valkey.core import HeldShards
from pyrula.workflows.stores.valkey.ended import EndedRuns
from pyrula.workflows.stores.valkey.events import EventOps
from pyrula.workflows.stores.valkey.finishing import FinishBatches
from pyrula.workflows.stores.valkey.keys import Keys, validate_namespace
from pyrula.workflows.stores.valkey.queue import QueueOps
from pyrula.workflows.stores.valkey.queued_purge import QueuedPurge
from pyrula.workflows.stores.valkey.runs import RunOps
from pyrula.workflows.stores.valkey.schedules import ScheduleOps
from pyrula.workflows.stores.valkey.shards import ShardLeases
from pyrula.workflows.stores.valkey.timers import TimerOps
from pyrula.workflows.stores.valkey.urls import STORE_OPTIONS

if TYPE_CHECKING:
    from pyrula.workflows.stores.valkey.blocking import BlockingValkey

log = logging.getLogger(__name__)

NAMESPACE_ENV = "PYRULA_VALKEY_NAMESPACE"
EVICTING_POLICIES = ("allkeys-lru", "allkeys-lfu", "allkeys-random")


class ValkeyStore(
    RunOps,
    EndedRuns,
    QueueOps,
    QueuedPurge,
    TimerOps,
    ScheduleOps,
    EventOps,
    ShardLeases,
    ScheduleAdmin,
):
    """Runs, journals, leases, timers, signals, schedules, flow control, batch-trigger
    buffers and cursors in Valkey.

    * ``url``: ``redis://``, ``rediss://``, ``valkey://``, ``valkeys://`` or ``unix://``;
      with ``cluster=True`` any one node of the cluster.
    * ``namespace`` (else ``PYRULA_VALKEY_NAMESPACE``, else ``"default"``) prefixes every
      key; see :mod:`.keys` for the rules and the key schema.
    * ``shard_count`` shards per namespace (every worker must use the same count: the
      first store records it and a different one raises ConfigurationError).
    * ``shard_lease_ttl`` / ``shard_lease_interval`` (seconds; the interval must be
      shorter) govern shard leases (:mod:`.shards`).
    * ``socket_timeout`` (seconds) bounds every call; blocking waits are cut into slices
      shorter than it.
    * ``clock``: for tests only. By default every time that decides anything (lease
      expiry, due times, schedule slots) is the server's ``TIME``, read inside the Lua;
      a clock given here is passed to the Lua instead.

    Every atomic operation is one function of a Lua library (:mod:`.functions`); each
    call touches one shard's slot. ``wait_run`` and idle claimers block on the server
    (``BLMOVE``/``BLPOP``) instead of polling.
    """

    def __init__(
        self,
        url: str = "redis://localhost:6379",
        *,
        namespace: str | None = None,
        shard_count: int = 64,
        cluster: bool = False,
        shard_lease_ttl: float = 30.0,
        shard_lease_interval: float = 10.0,
        socket_timeout: float = 10.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if namespace is None:
            namespace = os.environ.get(NAMESPACE_ENV) or "default"
        self.namespace = validate_namespace(namespace)
        if isinstance(shard_count, bool) or not isinstance(shard_count, int) or shard_count < 1:
            raise ConfigurationError(f"shard_count must be an int >= 1, got {shard_count!r}")
        for name, value in (
            ("shard_lease_ttl", shard_lease_ttl),
            ("shard_lease_interval", shard_lease_interval),
            ("socket_timeout", socket_timeout),
        ):
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigurationError(f"{name} must be a positive number, got {value!r}")
        if shard_lease_interval >= shard_lease_ttl:
            raise ConfigurationError(
                f"shard_lease_interval ({shard_lease_interval}s) must be shorter than "
                f"shard_lease_ttl ({shard_lease_ttl}s), or leases lapse between renewals"
            )
        self.url = mask_url(url)
        self.shard_count = shard_count
        self.cluster = cluster
        self.shard_lease_ttl = float(shard_lease_ttl)
        self.shard_lease_interval = float(shard_lease_interval)
        self.block_slice = max(0.05, min(5.0, socket_timeout / 2))
        self._clock = clock
        self._keys = Keys(self.namespace, shard_count)
        self._server = Server(
            url,
            self._keys,
            cluster=cluster,
            clock_arg=self._clock_arg,
            socket_timeout=float(socket_timeout),
        )
        self._notifier = Notifier()
        self._known_workflows: dict[str, int] = {}
        self._held: dict[str, HeldShards] = {}
        self._cursor: dict[str, int] = {}
        self._resynced: dict[str, float] = {}
        self._recover_from = 0
        self._shards_first = {}
        self._wake_turn = 0
        self._purge_turn = 0
        self._owned_workflows = {}
        self._finishes = FinishBatches(self)
        self._wake_waits = {}
        self._opened: tuple[int, int] | None = None

    @classmethod
    def from_url(cls, url: str) -> ValkeyStore:
        """A store for ``url``; ``namespace``, ``shard_count``, ``cluster``,
        ``shard_lease_ttl``, ``shard_lease_interval`` and ``socket_timeout`` may be given in
        its query string (they are not passed on to the connection)."""
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        ours = {k: v for k, v in query if k in STORE_OPTIONS}
        rest = urlencode([(k, v) for k, v in query if k not in STORE_OPTIONS])
        options: dict[str, Any] = {}
        if "namespace" in ours:
            options["namespace"] = ours["namespace"]
        if "cluster" in ours:
            options["cluster"] = ours["cluster"].lower() in ("1", "true", "yes")
        for name, kind in (
            ("shard_count", int),
            ("shard_lease_ttl", float),
            ("shard_lease_interval", float),
            ("socket_timeout", float),
        ):
            if name in ours:
                try:
                    options[name] = kind(ours[name])
                except ValueError:
                    raise ConfigurationError(
                        f"{name} in {mask_url(url)!r} must be a number, got {ours[name]!r}"
                    ) from None
        return cls(urlunsplit(parts._replace(query=rest)), **options)

    def __repr__(self) -> str:
        return (
            f"ValkeyStore({self.url!r}, namespace={self.namespace!r}, "
            f"shard_count={self.shard_count}, cluster={self.cluster})"
        )

    @property
    def data_loss(self) -> list[str]:
        """A message per data loss detected since this store started (oldest first)."""
        return list(self._server.data_loss)

    # -- lifecycle -------------------------------------------------------------------
    async def open(self) -> None:
        """Connect, check the server, load the library, record the shard count and write
        the data-loss markers. Idempotent; every operation calls it first if needed."""
        client = self._server.client()
        try:
            await client.ping()
        except Exception as exc:
            raise self._server.unreachable(exc) from None
        try:
            await self._check_eviction(client)
            await functions.check_not_pruned(client, self.url, self._server.lib)
            await functions.load_library(client, self.cluster, self._server.lib)
            await self._check_shard_count()
            markers = [self._keys.shard_marker(s) for s in range(self.shard_count)]
            await self._server.write_markers(client, [*self._keys.global_markers(), *markers])
            for node in self._nodes(client):
                self._server.run_ids[node] = await self._server.node_run_id(client, node)
        except (StoreError, ConfigurationError):
            raise
        except Exception as exc:
            raise self._server.translate(exc) from None
        self._opened = (os.getpid(), self._server.generation)

    async def _ensure_open(self) -> None:
        if self._opened != (os.getpid(), self._server.generation):
            await self.open()

    def _nodes(self, client: Any) -> list[str]:
        return [node.name for node in client.get_primaries()] if self.cluster else ["server"]

    async def _check_eviction(self, client: Any) -> None:
        """Refuse a server that may evict keys: eviction would silently lose runs. The
        policy is read from ``INFO memory``, which the documented worker ACL grants
        (``CONFIG GET`` is in ``@dangerous``)."""
        targets = list(client.get_primaries()) if self.cluster else [None]
        for node in targets:
            try:
                if node is None:
                    reply = await client.info("memory")
                else:
                    reply = await client.info("memory", target_nodes=node)
            except vex.ResponseError as exc:  # an ACL without +info
                log.warning(
                    "cannot read maxmemory-policy on %s (%s): make sure it is noeviction, "
                    "or evicted keys will silently lose runs",
                    self.url,
                    exc,
                )
                return
            policy = _policy(reply)
            if policy in EVICTING_POLICIES:
                raise ConfigurationError(
                    f"Valkey at {self.url} has maxmemory-policy {policy}, which may evict "
                    "any key and silently lose runs; set maxmemory-policy noeviction"
                )
            if policy.startswith("volatile"):
                # Only keys with a TTL are evicted: ours are wake-up lists, safe to lose.
                log.info("Valkey at %s has maxmemory-policy %s", self.url, policy)

    async def _check_shard_count(self) -> None:
        recorded = await self._server.call(
            "meta_check", self._keys.meta, "shards", str(self.shard_count)
        )
        count = int(text(recorded[0]))
        if count != self.shard_count:
            raise ConfigurationError(
                f"Valkey namespace {self.namespace!r} at {self.url} was set up with "
                f"shard_count={count}, this store has shard_count={self.shard_count}: use "
                "the same count on every worker and client (a run's shard follows from "
                "its id and the count; changing it means draining the namespace first)"
            )

    def blocking_runs(self) -> BlockingValkey | None:
        """The blocking client's fast path over this store (``BlockingFastPath``); none
        on a cluster."""
        if self.cluster:
            return None
        from pyrula.workflows.stores.valkey.blocking import BlockingValkey

        return BlockingValkey(self)

    async def close(self) -> None:
        await self._finishes.drain()  # finishes on their way: written or failed first
        self._notifier.close()
        await self._server.close()
        self._opened = None


def _policy(reply: Any) -> str:
    """``maxmemory_policy`` from an ``INFO memory`` reply (a cluster node's may come keyed
    by the node's name)."""
    if isinstance(reply, dict) and "maxmemory_policy" not in reply and len(reply) == 1:
        reply = next(iter(reply.values()))
    if isinstance(reply, dict):
        return text(reply.get("maxmemory_policy", ""))
    return ""
