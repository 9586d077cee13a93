"""Every key name ValkeyStore uses, and the only place they are spelled.

Every key is ``f"{namespace}:{rest}"``. A namespace matches ``[a-z0-9][a-z0-9_-]{0,63}``:
it holds no ``:``, so a key's first ``:``-separated part names its namespace and two
namespaces' keys can never collide, whatever the names (a namespace called ``run`` or
``meta`` is fine). It cannot start with ``_``, which keeps ``_pyrula:`` (server-wide
keys, see :data:`TOMBSTONE`) out of every namespace.

Key schema (``ns`` = namespace, ``k`` = shard number, ``{...}`` = the cluster hash tag)::

    per shard, prefix  P = ns:{ns:k}:        (one slot: every call on a shard is single-slot)
      P r:<run>            hash   a run record (field names in codec.py)
      P j:<run>            hash   its journal: position -> "attempts|token|recorded_at|entry"
      P g:<n>:<run>:<name> list   pending signals of one name (n = byte length of run)
      P gn:<run>           set    the names it has had signals of
      P k:<run>            set    child run ids;   P x:<run>  set  children that ended
      P z:<run>            list   rotated by wait_run waiters; pushed when the run ends
      P i:<key>            hash   an idempotency key: the run it names (+ the NewRun)
      P q:<wf>:<owner>     zset   an owner's queued runs: "%012d:run" by available_at
      P o:<wf>             zset   owners with queued runs, by DRR turn (stores/flow.py);
                                  empty while the default owner is alone (solo, common.lua)
      P s:<wf>             hash   owner -> claim counter at its last claim
      P c:<wf>             string the workflow's claim counter on this shard (DRR's clock)
      P d:<wf>             zset   named owners' queued runs by available_at (with the
                                  default owner's queue: the shard's next due)
      P t:<wf>             zset   sleeping/waiting runs by wake_at;  P tt  the same, all wfs
      P l                  zset   running runs by lease expiry
      P a                  zset   every run, "%012d:run" by created_at (listing)
      P e                  zset   runs that ended, by finished_at (purge_runs, ended_runs)
      P es                 string where the backfill of P e walks P a ("score member")
      P n / P tk / P v     string submission sequence / lease token / hint version
      P mk                 string the data-loss marker
    (<wf> is "<byte length>:<workflow>", so names with ':' stay unambiguous.)

    ns:{ns:meta}:m    hash  "shards" -> shard_count, "w:<workflow>" -> its shard_count
    ns:{ns:meta}:wk   hash  worker id -> heartbeat
    ns:{ns:meta}:n:<worker> list  lease news: pushed when a run the worker holds is
                      cancelled or terminated (``wait_lease_news`` blocks on it)
    ns:{ns:w:<wf>}:d  zset  hint: shard -> when it next has work of <wf>  (:v versions,
                      cluster only; :wake list idle claimers block on)
                      single node only: :r list, the ready list; :i list, in flight
                      from it ("<shard>:<run>" each; :ic the orphan scan's cursor in
                      it); :m string, set once a run of <wf> had an owner
                      (lua/common.lua list_entry)
    ns:{ns:timers}:d  zset  hint: shard -> its earliest timer   (:v versions, cluster only)
    ns:{ns:sched}:s:<id> hash a schedule;  :next zset enabled by next_fire_at;  :ids zset;
                      :chg stream of one entry, moved by every schedule change
    ns:{ns:flow}:b    hash  rate bucket -> "tokens|updated_at";  :c:<wf>:<owner> zset
                      running runs under an owner_concurrency cap, by lease expiry
    ns:{ns:leases}:h  hash  shard -> "worker|expires";  :w zset  lease holders by expiry
    every tag above also holds a ``mk`` marker (data-loss detection).

    ns:{ns:ev:<n>:<trigger>}:q  list  a batch trigger's buffer, oldest first:
                      "seq|created_at|payload" each (lua/events.lua);  :n string its
                      seq counter (kept when the buffer empties: seqs are never reused)
    ns:{ns:cur:<n>:<name>}:v    string a named cursor
    (<n> is the byte length of the name: a tag of its own per trigger and per cursor,
    whatever characters the name holds. A name with ``}`` cuts its hash tag short, at
    the same place in each of its keys, so they still share one slot. These tags hold no
    marker: a trigger is not worth a write per process; the shard and namespace markers
    report a lost node.)

A run's shard is a stable hash of its id up to the first ``.``: a child run, whose id the
engine spells ``<parent>.<position>``, shares its parent's shard, so starting a child,
waking the parent when it ends and cancelling a tree are single-slot operations.

The Lua library builds per-shard and hint keys from the same tables: :func:`lua_prelude`
generates its key helpers from this module.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from pyrula.workflows.errors import ConfigurationError

NAMESPACE_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
TOMBSTONE = "_pyrula:{functions}:pruned_libraries"
"""Server-wide set of library names removed by ``upgrade_scripts(prune_stale=True)``."""

SHARD_FAMILIES = {
    "run": "r:",
    "journal": "j:",
    "signal": "g:",
    "signal_names": "gn:",
    "kids": "k:",
    "kids_done": "x:",
    "done": "z:",
    "idem": "i:",
    "queue": "q:",
    "owners": "o:",
    "served": "s:",
    "counter": "c:",
    "due": "d:",
    "timers": "t:",
    "all_timers": "tt",
    "leases": "l",
    "all": "a",
    "ended": "e",
    "ended_scan": "es",
    "seq": "n",
    "token": "tk",
    "version": "v",
    "marker": "mk",
}
"""Per-shard key families: appended to the shard prefix (``ns:{ns:k}:``)."""

TRIGGER_FAMILIES = {"events": "q", "seq": "n"}
"""A batch trigger's keys: appended to its prefix (``ns:{ns:ev:<n>:<trigger>}:``)."""
TRIGGER_TAG = "ev:"
CURSOR_TAG = "cur:"
"""Hash tag names start with a shard number, a fixed word (``meta``, ``sched`` ...),
``w:``, or one of these: a trigger's or cursor's keys never meet another family's."""


def validate_namespace(namespace: str) -> str:
    if not isinstance(namespace, str) or NAMESPACE_RE.fullmatch(namespace) is None:
        raise ConfigurationError(
            f"invalid Valkey namespace {namespace!r}: use 1-64 characters from a-z, 0-9, "
            "'_' and '-', starting with a letter or digit (so no two namespaces' keys "
            "can ever collide)"
        )
    return namespace


def part(text: str) -> str:
    """A name inside a key, prefixed by its byte length so any characters stay unambiguous."""
    return f"{len(text.encode())}:{text}"


def shard_root(run_id: str) -> str:
    """The part of a run id that picks its shard: up to the first ``.``."""
    return run_id.split(".", 1)[0]


@dataclass(frozen=True)
class Keys:
    """Key names of one namespace with ``shard_count`` shards."""

    namespace: str
    shard_count: int

    # -- shards ------------------------------------------------------------------------
    def shard_of(self, run_id: str) -> int:
        return zlib.crc32(shard_root(run_id).encode()) % self.shard_count

    def shard_of_key(self, idempotency_key: str) -> int:
        return zlib.crc32(idempotency_key.encode()) % self.shard_count

    def shard(self, shard: int) -> str:
        """The shard prefix; also the key every call on that shard is routed by."""
        ns = self.namespace
        return f"{ns}:{{{ns}:{shard}}}:"

    def run_shard(self, run_id: str) -> str:
        return self.shard(self.shard_of(run_id))

    def run(self, run_id: str) -> str:
        return self.run_shard(run_id) + SHARD_FAMILIES["run"] + run_id

    def journal(self, run_id: str) -> str:
        return self.run_shard(run_id) + SHARD_FAMILIES["journal"] + run_id

    def signal(self, run_id: str, name: str) -> str:
        return self.run_shard(run_id) + SHARD_FAMILIES["signal"] + part(run_id) + ":" + name

    def kids(self, run_id: str) -> str:
        return self.run_shard(run_id) + SHARD_FAMILIES["kids"] + run_id

    def done(self, run_id: str) -> str:
        return self.run_shard(run_id) + SHARD_FAMILIES["done"] + run_id

    def idem(self, key: str) -> str:
        return self.shard(self.shard_of_key(key)) + SHARD_FAMILIES["idem"] + key

    def ended(self, shard: int) -> str:
        return self.shard(shard) + SHARD_FAMILIES["ended"]

    def shard_marker(self, shard: int) -> str:
        return self.shard(shard) + SHARD_FAMILIES["marker"]

    # -- namespace-wide ----------------------------------------------------------------
    def _tag(self, name: str) -> str:
        ns = self.namespace
        return f"{ns}:{{{ns}:{name}}}:"

    @property
    def meta(self) -> str:
        return self._tag("meta") + "m"

    @property
    def workers(self) -> str:
        return self._tag("meta") + "wk"

    def lease_news(self, worker_id: str) -> str:
        return self._tag("meta") + "n:" + worker_id

    @property
    def workers_seq(self) -> str:
        return self._tag("meta") + "wks"

    def hint(self, workflow: str) -> str:
        """Prefix of a workflow's hint keys (``d``, ``v``, ``wake``, ``mk``)."""
        return self._tag("w:" + workflow)

    def wake(self, workflow: str) -> str:
        return self.hint(workflow) + "wake"

    @property
    def timer_hint(self) -> str:
        return self._tag("timers")

    @property
    def sched(self) -> str:
        """Prefix of the schedule keys (``s:<id>``, ``next``, ``ids``)."""
        return self._tag("sched")

    def schedule(self, schedule_id: str) -> str:
        return self.sched + "s:" + schedule_id

    @property
    def schedules_by_time(self) -> str:
        return self.sched + "next"

    @property
    def flow(self) -> str:
        """Prefix of the flow-control keys (``b``, ``c:<wf>:<owner>``)."""
        return self._tag("flow")

    def concurrency(self, workflow: str, owner: str) -> str:
        return self.flow + "c:" + part(workflow) + ":" + owner

    @property
    def leases(self) -> str:
        """Prefix of the shard-lease keys (``h``, ``w``)."""
        return self._tag("leases")

    @property
    def lease_holders(self) -> str:
        return self.leases + "h"

    # -- batch triggers and cursors ---------------------------------------------------
    def trigger(self, name: str) -> str:
        """Prefix of a batch trigger's keys (:data:`TRIGGER_FAMILIES`): one slot."""
        return self._tag(TRIGGER_TAG + part(name))

    def trigger_events(self, name: str) -> str:
        return self.trigger(name) + TRIGGER_FAMILIES["events"]

    def trigger_seq(self, name: str) -> str:
        return self.trigger(name) + TRIGGER_FAMILIES["seq"]

    def cursor(self, name: str) -> str:
        return self._tag(CURSOR_TAG + part(name)) + "v"

    def tag_marker(self, key: str) -> str:
        """The data-loss marker living in the same slot as ``key``."""
        end = key.index("}:") + 2
        return key[:end] + "mk"

    @property
    def meta_marker(self) -> str:
        return self._tag("meta") + "mk"

    def hint_marker(self, workflow: str) -> str:
        return self.hint(workflow) + "mk"

    def global_markers(self) -> list[str]:
        return [self._tag(name) + "mk" for name in ("meta", "sched", "flow", "leases", "timers")]


def lua_prelude() -> str:
    """Lua key helpers for the function library, generated from the tables above."""
    families = ", ".join(f"{name} = {value!r}" for name, value in SHARD_FAMILIES.items())
    trigger = ", ".join(f"{name} = {value!r}" for name, value in TRIGGER_FAMILIES.items())
    return f"""-- generated from keys.py: the key families and hint keys (see its docstring)
local K = {{ {families} }}
local EV = {{ {trigger} }}
local function kpart(s) return #s .. ':' .. s end
local function hint_prefix(ns, wf) return ns .. ':{{' .. ns .. ':w:' .. wf .. '}}:' end
local function timer_hint_prefix(ns) return ns .. ':{{' .. ns .. ':timers}}:' end
local function shard_prefix(ns, k) return ns .. ':{{' .. ns .. ':' .. k .. '}}:' end
"""
