"""The cluster client of a ValkeyStore (:class:`ClusterClient`): valkey-py's
``ValkeyCluster`` with its redirection loop replaced, so that a worker rides through a
reshard. It follows MOVED and ASK, waits out slots that are moving, and never closes its
nodes' connections or forgets its nodes (valkey-py 6.2's loop did both under load: see
docs/valkey.md "Resharding while workers run")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from valkey import exceptions as vex
from valkey.asyncio.cluster import ClusterNode, ValkeyCluster
from valkey.cluster import PRIMARY, REPLICA, get_node_name
from valkey.crc import VALKEY_CLUSTER_HASH_SLOTS
from valkey.typing import EncodableT, KeyT
from valkey.utils import str_if_bytes

log = logging.getLogger(__name__)

REDIRECTS = 16
"""MOVED and ASK redirections one command follows before giving up (valkey-py's TTL)."""
HOLD_LIMIT = 30.0
"""Seconds a command waits at most for a slot to finish moving (TRYAGAIN, or an FCALL
told ASK); the store's own time limit per call (``socket_timeout``) usually ends it
first, as StoreUnavailable."""
HOLD_BACKOFF = (0.005, 0.1)
"""First and longest pause between tries while a slot moves (doubling)."""
_SCRIPTS = ("FCALL", "FCALL_RO")


def _moving_slot(exc: vex.ResponseError) -> bool:
    """Whether a script failed because a key it touched (not its declared one) has
    already moved to the importing node, or would be created in a migrating slot."""
    return "access a non local key" in str(exc)


class ClusterClient(ValkeyCluster):
    """valkey-py's ValkeyCluster, keeping to the cluster while slots move.

    valkey-py's own redirection loop (``_execute_command``) is replaced, because during
    a reshard it broke the client for good: it sent ``ASKING`` and the redirected
    command on two different pooled connections (so the target answered MOVED back,
    and the command bounced until "TTL exhausted"), and every fifth MOVED, and every
    connection error, closed every connection of every node, failing the commands in
    flight on them, which dropped their nodes from the startup list until none was
    left ("Valkey Cluster cannot be connected ... : None", forever). Here:

    * MOVED: the slot table is read again (CLUSTER SLOTS, existing nodes and their
      connections kept) and the command goes to the slot's new owner.
    * ASK: ``ASKING`` and the command go together on one connection of the importing
      node. Not for an FCALL: a function touches keys it does not declare, and on the
      importing node it would see only those moved so far (the others read as
      missing) and create keys that MIGRATE then refuses to overwrite. An FCALL told
      ASK waits instead, retried on the owner, until the slot has moved (MOVED).
    * TRYAGAIN (a multi-key command whose keys are split by the move), and a script
      that touched a key already moved ("non local key"): short pauses, retried.
    * A connection error re-reads the slot table (nothing closed) and is raised: the
      command is never sent twice. The table is read from the known nodes, else from
      the URL the client was made with, so a client never runs out of nodes to ask.
    """

    __slots__ = ("_reading", "_seed", "_table")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        seed = next(iter(self.nodes_manager.startup_nodes.values()))
        self._seed = (seed.host, int(seed.port))
        self._table = 0
        """How many times the slot table was read again (see :meth:`read_slots`)."""
        self._reading: asyncio.Lock | None = None

    async def _reset_for_reinitialize(self) -> None:
        # valkey-py's pipeline calls this after an error: re-read the table instead of
        # closing every connection (which fails every command in flight).
        await self._read_slots_quietly()

    async def _execute_command(
        self, target_node: ClusterNode, *args: KeyT | EncodableT, **kwargs: Any
    ) -> Any:
        try:
            return await target_node.execute_command(*args, **kwargs)
        except (vex.BusyLoadingError, vex.MaxConnectionsError):
            raise
        except (vex.ConnectionError, vex.TimeoutError):
            await self._read_slots_quietly(avoid=target_node)
            raise
        except vex.ClusterDownError:
            await self._read_slots_quietly()
            raise
        except vex.ResponseError as exc:
            if not isinstance(exc, (vex.AskError, vex.TryAgainError)) and not (
                args[0] in _SCRIPTS and _moving_slot(exc)
            ):
                raise
            return await self._redirected(target_node, exc, args, kwargs)

    async def _redirected(
        self,
        node: ClusterNode,
        exc: vex.ResponseError,
        args: tuple[KeyT | EncodableT, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """The slow path: follow MOVED and ASK, wait out a moving slot."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + HOLD_LIMIT
        script = args[0] in _SCRIPTS
        asking = False
        redirects = pauses = 0
        while True:
            if isinstance(exc, vex.MovedError):
                node = await self._moved(exc)
                asking = False
                redirects += 1
            elif isinstance(exc, vex.AskError) and not script:
                node = self._node_at(exc.host, int(exc.port))
                asking = True
                redirects += 1
            else:  # TRYAGAIN, or an FCALL in a slot on the move: same node, later
                if loop.time() >= give_up:
                    raise vex.ClusterError(
                        f"slot still moving after {HOLD_LIMIT:g} s (last reply: {exc})"
                    ) from None
                await asyncio.sleep(min(HOLD_BACKOFF[0] * 2**pauses, HOLD_BACKOFF[1]))
                pauses += 1
            if redirects > REDIRECTS:
                raise vex.ClusterError(f"TTL exhausted (last redirection: {exc})")
            try:
                if asking:
                    return await _asking(node, args, kwargs)
                return await node.execute_command(*args, **kwargs)
            except (vex.AskError, vex.TryAgainError) as again:
                exc = again
            except vex.ClusterDownError:
                await self._read_slots_quietly()
                raise
            except vex.ResponseError as again:
                if not (script and _moving_slot(again)):
                    raise
                exc = again
            except (vex.ConnectionError, vex.TimeoutError) as lost:
                if not isinstance(lost, (vex.BusyLoadingError, vex.MaxConnectionsError)):
                    await self._read_slots_quietly(avoid=node)
                raise

    async def _moved(self, exc: vex.MovedError) -> ClusterNode:
        """The slot's new owner, after reading the slot table again: a slot that moved
        is seldom the only one."""
        await self._read_slots_quietly(first=self._node_at(exc.host, int(exc.port)))
        owner = self._node_at(exc.host, int(exc.port))
        slots = self.nodes_manager.slots_cache
        if not slots.get(exc.slot_id) or slots[exc.slot_id][0] is not owner:
            owner.server_type = PRIMARY
            slots[exc.slot_id] = [owner]  # a table read from a node not yet told
        return owner

    def _node_at(self, host: str, port: int) -> ClusterNode:
        """The known node at ``host:port``, or a new one (a node added since)."""
        manager = self.nodes_manager
        node = manager.get_node(host=host, port=port)
        if node is None:
            node = ClusterNode(host, port, PRIMARY, **manager.connection_kwargs)
            manager.nodes_cache[node.name] = node
        return node

    async def _read_slots_quietly(
        self, first: ClusterNode | None = None, avoid: ClusterNode | None = None
    ) -> None:
        try:
            await self.read_slots(first, avoid)
        except Exception as exc:  # the next command reports the outage, if it lasts
            log.debug("reading the cluster's slot table failed: %s", exc)

    async def read_slots(
        self, first: ClusterNode | None = None, avoid: ClusterNode | None = None
    ) -> None:
        """Read the slot table again (CLUSTER SLOTS) from ``first``, else any known
        node (``avoid`` last), else the client's URL; nodes already known keep their
        connections. Concurrent callers share one read."""
        if self._initialize or self._closed:
            return  # the next command's initialize() reads it anyway
        if self._reading is None:
            self._reading = asyncio.Lock()
        seen = self._table
        async with self._reading:
            if self._table != seen:
                return  # read meanwhile, after the caller's reason to read it
            manager = self.nodes_manager
            candidates: dict[str, ClusterNode] = {}
            for node in (first, *manager.nodes_cache.values(), *manager.startup_nodes.values()):
                if node is not None and node is not avoid:
                    candidates.setdefault(node.name, node)
            if avoid is not None:
                candidates.setdefault(avoid.name, avoid)
            error: BaseException | None = None
            for node in candidates.values():
                try:
                    await self._adopt(await node.execute_command("CLUSTER SLOTS"), node)
                except Exception as exc:
                    error = exc
                    continue
                self._table += 1
                return
            seed = ClusterNode(*self._seed, **manager.connection_kwargs)
            try:
                await self._adopt(await seed.execute_command("CLUSTER SLOTS"), seed)
            except Exception:
                raise error or vex.ClusterError("no node to read the slot table from") from None
            finally:
                if manager.nodes_cache.get(seed.name) is not seed:
                    await seed.disconnect()
            self._table += 1

    async def _adopt(self, reply: Any, via: ClusterNode) -> None:
        """Make ``reply`` (CLUSTER SLOTS) the slot table, reusing the known nodes."""
        manager = self.nodes_manager
        nodes: dict[str, ClusterNode] = {}
        slots: dict[int, list[ClusterNode]] = {}
        for start, end, *members in reply:
            group = []
            for i, member in enumerate(members):
                host = str_if_bytes(member[0]) or via.host
                host, port = manager.remap_host_port(host, int(member[1]))
                name = get_node_name(host, port)
                node = nodes.get(name) or manager.nodes_cache.get(name)
                if node is None:
                    node = ClusterNode(host, port, **manager.connection_kwargs)
                node.server_type = REPLICA if i else PRIMARY
                nodes[name] = node
                group.append(node)
            for slot in range(int(start), int(end) + 1):
                slots[slot] = group
        if len(slots) < VALKEY_CLUSTER_HASH_SLOTS and manager.require_full_coverage:
            raise vex.ClusterError(f"{via.name} covers {len(slots)} slots: not all of them")
        manager.slots_cache = slots
        manager.set_nodes(manager.nodes_cache, nodes, remove_old=True)
        if manager._dynamic_startup_nodes:
            manager.set_nodes(manager.startup_nodes, nodes, remove_old=True)
        manager._moved_exception = None  # type: ignore[assignment]  # valkey-py does so too
        default = manager.default_node
        if default is None or default.name not in nodes or default.server_type != PRIMARY:
            primaries = (n for n in nodes.values() if n.server_type == PRIMARY)
            manager.default_node = next(primaries, default)
        await manager._close_pending_node_disconnects()  # nodes gone from the table


async def _asking(node: ClusterNode, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``ASKING`` then the command, on one connection of ``node`` (the importing one)."""
    kwargs.pop("keys", None)
    connection = node.acquire_connection()
    try:
        await connection.send_packed_command(connection.pack_commands([("ASKING",), args]), False)
        refused: vex.ResponseError | None = None
        try:
            await connection.read_response()
        except vex.ResponseError as exc:  # the command's reply is still to be read
            refused = exc
        reply = await node.parse_response(connection, args[0], **kwargs)
        if refused is not None:
            raise refused
        return reply
    finally:
        node._free.append(connection)
