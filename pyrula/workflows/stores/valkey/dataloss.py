"""Data-loss detection: marker keys that vanish together with the data beside them.

When a store opens it writes a marker (``...:mk``) in every hash-tag slot it uses, with
``SET NX GET``: the first process to write one stores its own random value there, every
later one learns that value. A marker that is gone, or that holds another value (a
process that started after the loss wrote it anew), means its node lost its data:

* restarted without persistence: its ``run_id`` changed and its function libraries went
  too, so the next FCALL there answers "Function not found";
* flushed (``FLUSHALL``, ``FLUSHDB``) while it kept running: the libraries stay, so only
  the markers tell.

One marker per node is checked (:meth:`DataLoss.verify`): after the server could not be
reached, every :data:`CHECK_EVERY_CALLS` calls or :data:`CHECK_EVERY_SECONDS` seconds
(at the start of the call that reaches the bound), and when a call fails with
RunNotFound or LeaseLost (a run this process knew of is gone). A call answered
"Function not found" checks the marker of its own slot. A loss is logged at ERROR,
appended to ``data_loss`` and raised as StoreUnavailable by the call that found it, once
per loss; the markers are then written again and ``generation`` goes up, so the store
opens again (library, shard count, markers) and carries on.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.errors import StoreError, StoreUnavailable
from pyrula.workflows.stores.valkey import functions
from pyrula.workflows.stores.valkey.keys import Keys

log = logging.getLogger(__name__)

CHECK_EVERY_CALLS = 1000
CHECK_EVERY_SECONDS = 5.0
"""The markers are checked again after this many calls or seconds, whichever comes
first: a flush of a server that keeps running is reported within that bound."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class DataLoss:
    """The data-loss half of :class:`.connection.Server`."""

    masked: str
    keys: Keys
    cluster: bool
    lib: functions.Library

    def __init__(self) -> None:
        self.run_ids: dict[str, str] = {}
        """Each node's ``run_id`` as of open(): a restart changes it."""
        self.markers: dict[str, str] = {}
        """The markers this process wrote or read: key -> the value they hold."""
        self.generation = 0
        """Goes up each time a data loss is detected (caches keyed on it start over)."""
        self.data_loss: list[str] = []
        """The message of every data loss detected, oldest first."""
        self._unreachable = False
        """Set when the server could not be reached: it may have restarted, so the next
        call first checks the markers."""
        self._calls = 0
        self._checked_at = time.monotonic()

    @property
    def _suspect(self) -> bool:
        """Whether the next call must check the markers first whatever the call count:
        the server was unreachable, or the last check is CHECK_EVERY_SECONDS old (the
        blocking fast path of blocking.py reads this and leaves such a call to the
        async path, which checks)."""
        return self._unreachable or (
            bool(self.markers) and time.monotonic() - self._checked_at >= CHECK_EVERY_SECONDS
        )

    @_suspect.setter
    def _suspect(self, value: bool) -> None:
        self._unreachable = value

    def client(self) -> Any:
        raise NotImplementedError  # Server

    def translate(self, exc: BaseException) -> BaseException:
        raise NotImplementedError  # Server

    def _check_due(self) -> bool:
        """Whether this call should check the markers first (counts the call)."""
        if self._unreachable:
            return True
        if not self.markers:
            return False  # not opened yet: nothing to compare with
        self._calls += 1
        return self._calls >= CHECK_EVERY_CALLS or self._suspect

    async def _lost(self, client: Any, markers: Sequence[str]) -> str | None:
        """The first of ``markers`` that is gone or holds another value, if any."""
        values = await asyncio.gather(*(client.get(marker) for marker in markers))
        for marker, value in zip(markers, values, strict=True):
            if value is None or _text(value) != self.markers.get(marker):
                return marker
        return None

    async def recover_library(self, client: Any, key: str) -> None:
        """A node answered "Function not found": load the library again, unless it was
        pruned on purpose; if the node also lost the data, say so loudly."""
        seen = self.generation
        try:
            await functions.check_not_pruned(client, self.masked, self.lib)
            marker = self.keys.tag_marker(key)
            if marker not in self.markers:
                marker = self.keys.meta_marker
            lost = marker in self.markers and await self._lost(client, [marker]) is not None
            await functions.load_library(client, self.cluster, self.lib)
            if lost:
                await self.report_data_loss(client, marker, seen)
        except StoreError:
            raise
        except Exception as exc:
            raise self.translate(exc) from None
        log.warning(
            "Valkey at %s had lost the pyrula function library (restarted, or a new node); "
            "loaded %s again",
            self.masked,
            self.lib.name,
        )

    async def verify(self) -> None:
        """Are the markers still there, one per node, as this process knows them? A
        node that restarted without persistence or was flushed lost them."""
        self._unreachable = False
        self._calls = 0
        self._checked_at = time.monotonic()
        if not self.markers:
            return
        seen = self.generation
        client = self.client()
        try:
            if self.cluster:
                await client.initialize()  # the slot map may have been reset by an error
            by_node: dict[str, str] = {}
            for marker in sorted(self.markers):
                node = client.get_node_from_key(marker).name if self.cluster else "server"
                by_node.setdefault(node, marker)
            lost = await self._lost(client, list(by_node.values()))
            if lost is not None:
                await functions.load_library(client, self.cluster, self.lib)
                await self.report_data_loss(client, lost, seen)
        except StoreError:
            raise
        except Exception as exc:
            raise self.translate(exc) from None

    async def report_data_loss(self, client: Any, marker: str, seen: int) -> None:
        """Report the loss ``marker`` shows, unless another call reported one since
        ``seen`` (the generation when the check began): raises StoreUnavailable."""
        if self.generation != seen:
            return
        node = client.get_node_from_key(marker).name if self.cluster else "server"
        before = self.run_ids.get(node, "unknown")
        now = await self.node_run_id(client, node)
        if self.generation != seen:
            return
        self.generation += 1
        self.run_ids[node] = now
        if before != now:
            how = (
                f"the node's run_id changed from {before} to {now} and the marker key "
                f"{marker!r} written at first use is gone. It was restarted without "
                "persistence (or flushed): runs, journals and schedules it held are gone. "
                "Enable persistence (appendonly yes) on production servers."
            )
        else:
            how = (
                f"the marker key {marker!r} written at first use is gone (or was written "
                f"anew by another process) while the node kept running (run_id {now}). "
                "It was flushed (FLUSHALL or FLUSHDB) or the keys were deleted: runs, "
                "journals and schedules it held are gone. Never flush a server that holds "
                "pyrula runs; separate stores with namespaces instead."
            )
        message = f"Valkey at {self.masked} LOST ITS DATA: {how}"
        log.error(message)
        self.data_loss.append(message)
        await self.write_markers(client, list(self.markers), fresh=True)
        raise StoreUnavailable(message)

    async def write_markers(
        self, client: Any, markers: Sequence[str], *, fresh: bool = False
    ) -> None:
        """Write the markers nobody wrote yet and learn the values of the others, in one
        round trip per node whatever their number.

        Each call writes a value of its own, so a marker written again after a loss never
        holds the value it held before. A marker this process knew keeps the value it
        knew (a mismatch is a loss :meth:`verify` will report), unless ``fresh``: after a
        reported loss, whatever the markers hold now is the new normal."""
        value = uuid.uuid4().hex[:16]
        async with client.pipeline(transaction=False) as pipe:
            for marker in markers:
                pipe.set(marker, value, nx=True, get=True)
            found = await pipe.execute()
        for marker, old in zip(markers, found, strict=True):
            if fresh or marker not in self.markers:
                self.markers[marker] = value if old is None else _text(old)

    async def node_run_id(self, client: Any, node: str) -> str:
        if not self.cluster:
            info = await client.info("server")
            return str(info.get("run_id", "unknown"))
        target = next((n for n in client.get_nodes() if n.name == node), None)
        if target is None:
            return "unknown"
        info = await client.execute_command("INFO", "server", target_nodes=target)
        if isinstance(info, dict) and "run_id" not in info and info:
            info = next(iter(info.values()))
        return str(info.get("run_id", "unknown")) if isinstance(info, dict) else "unknown"
