"""How records are laid out in Valkey hashes and how replies are read back.

Run hash fields (absent = None / 0 / False)::

    wf workflow   p params    st status    ow owner     ik idempotency_key
    ca created_at aa available_at  ua updated_at  sa started_at  fa finished_at
    rs result     er error    wk worker_id  tk lease_token  le lease_expires_at
    cr cancel_requested ("1")  rc recoveries  cl claims   pa parent_run_id
    wa wake_at    ws wait_signal  wc wait_child
    fk rate_key   fr rate_per_second  fb rate_burst  fc owner_concurrency
    ps progress_state  pi progress_info  ex expires_at  xe the RunExpired error to store
    fp failed_position
    sq submission sequence on its shard   sp DRR stamp (stores/flow.py)

Times are written with ``%.17g`` so a float survives the round trip exactly.
A journal entry is ``"attempts|token|recorded_at|" + pack_entry(...)``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from pyrula.workflows.records import (
    DEFAULT_OWNER,
    NO_FLOW,
    FlowControl,
    JournalEntry,
    NewRun,
    RunRecord,
    RunStatus,
    ScheduleRecord,
)
from pyrula.workflows.stores.rules import expired_error


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def pairs(flat: Sequence[Any] | str | bytes) -> dict[str, str]:
    """A flat ``[field, value, ...]`` reply, or a run packed by the Lua (one JSON string,
    see :func:`unpack_fields`), as a dict of str."""
    if isinstance(flat, (str, bytes)):
        return unpack_fields(flat)
    return {text(flat[i]): text(flat[i + 1]) for i in range(0, len(flat), 2)}


def unpack_fields(packed: str | bytes) -> dict[str, str]:
    """Read back lua/common.lua's ``pack_flat`` (a JSON array ``[field, value, ...]``) or
    ``pack_run`` (a JSON object, with ``id`` too); every value is a JSON string."""
    data = json.loads(packed)
    if isinstance(data, dict):
        return data
    if not isinstance(data, list) or len(data) % 2:
        raise ValueError(f"malformed packed fields: {str(packed)[:80]!r}")
    return dict(zip(data[::2], data[1::2], strict=True))


def num(value: float) -> str:
    """A float as the Lua side reads it back exactly."""
    return repr(float(value))


def _opt_float(fields: dict[str, str], name: str) -> float | None:
    value = fields.get(name)
    return None if value is None else float(value)


def to_run(run_id: str, flat: Sequence[Any] | dict[str, str]) -> RunRecord:
    f = flat if isinstance(flat, dict) else pairs(flat)
    get = f.get
    if "fk" in f or "fr" in f or "fb" in f or "fc" in f:
        flow = FlowControl(
            rate_key=get("fk"),
            rate_per_second=_opt_float(f, "fr"),
            rate_burst=float(f["fb"]) if "fb" in f else 1.0,
            owner_concurrency=int(f["fc"]) if "fc" in f else None,
        )
    else:
        flow = NO_FLOW  # the same value FlowControl() builds, shared (it is frozen)
    status = f["st"]
    sa, fa, le, wa, ex, fp = get("sa"), get("fa"), get("le"), get("wa"), get("ex"), get("fp")
    return built_run(
        {
            "run_id": run_id,
            "workflow": f["wf"],
            "params": f["p"],
            "status": _STATUS[status] if status in _STATUS else RunStatus(status),
            "owner": get("ow", DEFAULT_OWNER),
            "idempotency_key": get("ik"),
            "created_at": float(f["ca"]),
            "available_at": float(f["aa"]),
            "updated_at": float(f["ua"]),
            "started_at": None if sa is None else float(sa),
            "finished_at": None if fa is None else float(fa),
            "result": get("rs"),
            "error": get("er"),
            "worker_id": get("wk"),
            "lease_token": int(get("tk", "0")),
            # A run keeps its last lease expiry after the lease: it only counts while running.
            "lease_expires_at": None if le is None or status != "running" else float(le),
            "cancel_requested": get("cr") == "1",
            "recoveries": int(get("rc", "0")),
            "claims": int(get("cl", "0")),
            "parent_run_id": get("pa"),
            "wake_at": None if wa is None else float(wa),
            "wait_signal": get("ws"),
            "wait_child": get("wc"),
            "flow": flow,
            "expires_at": None if ex is None else float(ex),
            "progress_state": get("ps"),
            "progress_info": get("pi"),
            "failed_position": None if fp is None else int(fp),
        }
    )


RUN_FIELDS = tuple(field.name for field in dataclasses.fields(RunRecord))


def built_run(values: dict[str, Any]) -> RunRecord:
    """``RunRecord(**values)`` without the frozen dataclass's ``__init__``, which sets its
    28 fields one ``object.__setattr__`` at a time: a third of what reading a claimed run
    costs the worker. ``values`` names every field, in :data:`RUN_FIELDS` order, with
    values of the declared types (test_codec.py holds ``to_run`` to that)."""
    run = object.__new__(RunRecord)
    object.__setattr__(run, "__dict__", values)
    return run


_STATUS = {status.value: status for status in RunStatus}


def new_run_args(new: NewRun) -> list[str]:
    """create's ARGV[4..18] (see lua/runs.lua)."""
    flow = new.flow
    has_rate = flow.rate_key is not None and bool(flow.rate_per_second)
    return [
        new.run_id,
        new.workflow,
        new.params,
        new.owner,
        "1" if new.idempotency_key is not None else "0",
        new.idempotency_key or "",
        num(new.delay),
        "" if new.start_at is None else num(new.start_at),
        new.parent_run_id or "",
        flow.rate_key if has_rate and flow.rate_key is not None else "",
        num(flow.rate_per_second) if has_rate and flow.rate_per_second else "",
        num(flow.rate_burst) if has_rate else "",
        "" if flow.owner_concurrency is None else str(int(flow.owner_concurrency)),
        "" if new.expires_at is None else num(new.expires_at),
        "" if new.expires_at is None else expired_error(_stub(new)),
    ]


def ready_args(new: NewRun) -> list[str] | None:
    """create_ready's ARGV[4..] (lua/runs.lua) when ``new`` may go straight to its
    workflow's ready list on a single node: no idempotency key, parent, owner, flow
    control, delay or start_at. Else None (``create`` takes it)."""
    flow = new.flow
    if (
        new.idempotency_key is not None
        or new.parent_run_id is not None
        or new.owner != DEFAULT_OWNER
        or new.delay
        or new.start_at is not None
        or (flow.rate_key is not None and flow.rate_per_second)
        or flow.owner_concurrency is not None
    ):
        return None
    if new.expires_at is None:
        return [new.run_id, new.workflow, new.params, "", ""]
    return [new.run_id, new.workflow, new.params, num(new.expires_at), expired_error(_stub(new))]


def ready_run(new: NewRun, at: str, seq: str) -> RunRecord:
    """The record create_ready stored for ``new`` (queued at server time ``at``)."""
    fields = {"wf": new.workflow, "p": new.params, "ow": DEFAULT_OWNER, "ca": at, "sq": seq,
              "st": "queued", "aa": at, "ua": at, "q": "r"}  # fmt: skip
    if new.expires_at is not None:
        fields["ex"] = num(new.expires_at)
    return to_run(new.run_id, fields)


def _stub(new: NewRun) -> RunRecord:
    """Enough of a record for the rules that only read its id."""
    return RunRecord(new.run_id, new.workflow, new.params, RunStatus.QUEUED, new.owner,
                     new.idempotency_key, 0.0, 0.0, 0.0)  # fmt: skip


def new_run_from_reservation(key: str, f: dict[str, str]) -> NewRun:
    """The NewRun an idempotency reservation holds (to finish a creation left halfway)."""
    return NewRun(
        run_id=f["id"],
        workflow=f["wf"],
        params=f["p"],
        owner=f["ow"],
        idempotency_key=key,
        delay=float(f["dl"]),
        start_at=float(f["sa"]) if f["sa"] else None,
        parent_run_id=f["pa"] or None,
        flow=FlowControl(
            rate_key=f["fk"] or None,
            rate_per_second=float(f["fr"]) if f["fr"] else None,
            rate_burst=float(f["fb"]) if f["fb"] else 1.0,
            owner_concurrency=int(f["fc"]) if f["fc"] else None,
        ),
        expires_at=float(f["ex"]) if f.get("ex") else None,
    )


# -- journal ---------------------------------------------------------------------------
def entry_head(kind: str, name: str) -> str:
    return f"{len(kind.encode())}:{kind}{len(name.encode())}:{name}"


def pack_entry(entry: JournalEntry) -> str:
    """Kind, name, ok and value: what makes two writes at one position the same."""
    return entry_head(entry.kind, entry.name) + ("1" if entry.ok else "0") + entry.value


FINISH_FIELDS = 11
"""The arguments of one finish (lua/leases.lua finish's ARGV[4..], finish_many's stride
after the shard): run id, token, status, has_result, result, has_error, error,
failed_position, and the last step's position, attempts and entry ('' none)."""


def entry_args(entry: JournalEntry) -> list[str]:
    """An entry as the Lua functions that write one take it: position, attempts, packed."""
    return [str(entry.position), str(entry.attempts), pack_entry(entry)]


def unpack_entry(packed: str) -> tuple[str, str, bool, str]:
    """(kind, name, ok, value) of a packed entry; lengths are UTF-8 byte counts."""
    raw = packed.encode()
    colon = raw.index(b":")
    size = int(raw[:colon])
    kind = raw[colon + 1 : colon + 1 + size].decode()
    at = colon + 1 + size
    colon = raw.index(b":", at)
    size = int(raw[at:colon])
    name = raw[colon + 1 : colon + 1 + size].decode()
    at = colon + 1 + size
    return kind, name, raw[at : at + 1] == b"1", raw[at + 1 :].decode()


def to_entry(run_id: str, position: int, stored: str) -> JournalEntry:
    attempts, token, recorded_at, packed = stored.split("|", 3)
    kind, name, ok, value = unpack_entry(packed)
    return JournalEntry(
        run_id=run_id,
        position=position,
        kind=kind,
        name=name,
        ok=ok,
        value=value,
        attempts=int(attempts),
        token=int(token),
        recorded_at=float(recorded_at),
    )


# -- schedules -------------------------------------------------------------------------
def schedule_fields(schedule: ScheduleRecord) -> list[str]:
    """The definition's field, value pairs (sched_create adds the state fields)."""
    out = ["id", schedule.schedule_id, "wf", schedule.workflow, "p", schedule.params]
    out += ["tz", schedule.timezone]
    out += ["ow", schedule.owner]
    out += ["ov", schedule.overlap]
    if schedule.cron is not None:
        out += ["cron", schedule.cron]
    if schedule.every is not None:
        out += ["every", num(schedule.every)]
    return out


def to_schedule(flat: Sequence[Any]) -> ScheduleRecord:
    f = pairs(flat)
    return ScheduleRecord(
        schedule_id=f["id"],
        workflow=f["wf"],
        params=f["p"],
        cron=f.get("cron"),
        every=_opt_float(f, "every"),
        timezone=f["tz"],
        enabled=f["en"] == "1",
        next_fire_at=float(f["nf"]),
        last_fire_at=_opt_float(f, "lf"),
        owner=f.get("ow", DEFAULT_OWNER),
        created_at=float(f["ca"]),
        updated_at=float(f["ua"]),
        overlap=f.get("ov", "allow_all"),  # a schedule an older build stored: none
        last_run_id=f.get("lr"),
    )
