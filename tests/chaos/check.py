"""The checker: side-effect ledger + store snapshots -> figures and invariant violations.

Sources: what the driver submitted (run id -> expected result), the ledger the steps
appended (``start``/``end`` lines with run id, step, pid, lease token, wall time), two
store snapshots taken after quiescing, and the fault windows the harness injected.

Invariants (numbering from the reliability plan, section 2.2):

* I1 no lost run: every submitted run is terminal after quiescing.
* I2 one outcome: each run completed once with the expected result (I6), unchanged
  between the two snapshots.
* I3 no re-execution after journaling: no ledger ``start`` of a journaled step by the
  claimant that journaled it (same token) after it was recorded, nor by any later
  claimant (larger token). A start by an *older* claimant after the journal write (a
  paused worker that resumed) is a stale start: a duplicate, not a re-execution.
* I4 bounded duplicates: every wasted execution (a ``start`` whose token is not the
  journaled one) was by a fault victim inside its fault window; and
  duplicates <= faults x max runs in flight per worker.
* I5 fencing: journal positions are 0..n-1, tokens never decrease along them and never
  exceed the run's final token.

Run as ``python -m tests.chaos.check DIR`` on a test's artifact directory to re-check it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pyrula.workflows.records import JournalEntry, RunRecord, RunStatus
from pyrula.workflows.serialization import decode
from pyrula.workflows.stores.base import Store

FIGURES = [
    "submitted",
    "completed",
    "lost",
    "failed",
    "dead",
    "cancelled",
    "terminated",
    "wrong_results",
    "outcome_changes",
    "step_starts",
    "dup_step_execs",
    "reexecutions",
    "same_claimant_dups",
    "wasted_execs",
    "stale_starts_after_journal",
    "in_flight_at_faults",
    "faults",
    "claims",
    "recoveries",
]
"""The figures a report prints, in order."""


@dataclass(frozen=True)
class FaultWindow:
    """A fault on process ``pid``: its executions that started in ``[start, end]`` may
    be wasted (``kill``: the process's whole life; ``stop``: up to a lease after SIGCONT).
    """

    kind: str
    pid: int
    start: float
    end: float


@dataclass
class Snapshot:
    runs: dict[str, RunRecord | None]
    journals: dict[str, list[JournalEntry]]


@dataclass
class Report:
    figures: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def text(self, limit: int = 20) -> str:
        lines = ["chaos figures: " + ", ".join(f"{k}={v}" for k, v in self.figures.items())]
        lines += [f"VIOLATION: {v}" for v in self.violations[:limit]]
        if len(self.violations) > limit:
            lines.append(f"... and {len(self.violations) - limit} more violations")
        return "\n".join(lines)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The ledger's complete lines (a torn last line, if any, is skipped)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for chunk in raw.split(b"\n"):
        if chunk.strip():
            try:
                lines.append(json.loads(chunk))
            except json.JSONDecodeError:
                continue
    return lines


async def quiesce(store: Store, run_ids: list[str], timeout: float) -> list[str]:
    """Wait until every run is terminal; return the ones that are not."""
    deadline = time.monotonic() + timeout
    pending = list(run_ids)
    while True:
        still = []
        for run_id in pending:
            run = await store.get_run(run_id)
            if run is None or not run.is_terminal:
                still.append(run_id)
        pending = still
        if not pending or time.monotonic() > deadline:
            return pending
        await asyncio.sleep(0.2)


async def take_snapshot(store: Store, run_ids: Iterable[str]) -> Snapshot:
    runs: dict[str, RunRecord | None] = {}
    journals: dict[str, list[JournalEntry]] = {}
    for run_id in run_ids:
        runs[run_id] = await store.get_run(run_id)
        journals[run_id] = await store.load_journal(run_id)
    return Snapshot(runs, journals)


def _outcome(run: RunRecord | None) -> tuple[Any, ...] | None:
    if run is None:
        return None
    return (run.status, run.result, run.error, run.finished_at, run.lease_token)


def check(
    *,
    expected: Mapping[str, Any],
    ledger: Sequence[Mapping[str, Any]],
    snapshot: Snapshot,
    later: Snapshot | None = None,
    faults: Sequence[FaultWindow] = (),
    max_in_flight: int = 1,
) -> Report:
    """Check every invariant; return the figures and the violations found."""
    report = Report()
    v = report.violations
    fig: Counter[str] = Counter(submitted=len(expected))

    # I1, I2, I6: outcomes.
    for run_id, want in expected.items():
        run = snapshot.runs.get(run_id)
        if run is None or not run.is_terminal:
            fig["lost"] += 1
            v.append(f"I1 lost: run {run_id} is {run.status.value if run else 'missing'}")
            continue
        fig[run.status.value] += 1
        fig["recoveries"] += run.recoveries
        fig["claims"] += run.claims
        if run.status is not RunStatus.COMPLETED:
            v.append(f"I2 run {run_id} ended {run.status.value}: {run.error}")
        elif decode(run.result or "null") != want:
            fig["wrong_results"] += 1
            v.append(f"I6 run {run_id} returned {run.result}, expected {want!r}")
        if later is not None and _outcome(later.runs.get(run_id)) != _outcome(run):
            fig["outcome_changes"] += 1
            v.append(f"I2 run {run_id} outcome changed after quiescing")

    # I5: the journal's shape and tokens.
    journaled: dict[tuple[str, str], JournalEntry] = {}
    for run_id in expected:
        entries = snapshot.journals.get(run_id, [])
        run = snapshot.runs.get(run_id)
        if [e.position for e in entries] != list(range(len(entries))):
            v.append(f"I5 run {run_id}: journal positions {[e.position for e in entries]}")
        tokens = [e.token for e in entries]
        if tokens != sorted(tokens):
            v.append(f"I5 run {run_id}: journal tokens decrease along positions: {tokens}")
        if run is not None and tokens and max(tokens) > run.lease_token:
            v.append(f"I5 run {run_id}: journal token {max(tokens)} > run's {run.lease_token}")
        for entry in entries:
            journaled[(run_id, entry.name)] = entry

    # I3, I4: executions per journaled step.
    starts: dict[tuple[str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for line in ledger:
        if line.get("phase") == "start" and line.get("run_id") in expected:
            starts[(line["run_id"], line["step"])].append(line)
    fig["step_starts"] = sum(len(s) for s in starts.values())
    fig["faults"] = len(faults)
    for key, lines in sorted(starts.items()):
        run_id, step = key
        fig["dup_step_execs"] += len(lines) - 1
        found = journaled.get(key)
        if found is None:
            run = snapshot.runs.get(run_id)
            if run is not None and run.status is RunStatus.COMPLETED:
                v.append(f"I3 run {run_id}: step {step} ran but is not in the journal")
            continue
        entry = found
        mine = [s for s in lines if s.get("token") == entry.token]
        if not mine:
            v.append(f"run {run_id}: journaled {step} (token {entry.token}) has no ledger start")
        elif len(mine) > 1:
            fig["same_claimant_dups"] += len(mine) - 1
            v.append(f"I3 run {run_id}: claimant {entry.token} started {step} {len(mine)} times")
        for line in lines:
            token, t = line.get("token"), float(line["t"])
            if token is None:
                v.append(f"run {run_id}: ledger start of {step} without a lease token")
                continue
            if token > entry.token or (token == entry.token and t > entry.recorded_at):
                fig["reexecutions"] += 1
                v.append(
                    f"I3 run {run_id}: {step} journaled at {entry.recorded_at:.3f} by token "
                    f"{entry.token} started again at {t:.3f} by token {token} pid {line['pid']}"
                )
            elif token < entry.token:
                fig["wasted_execs"] += 1
                if t > entry.recorded_at:
                    fig["stale_starts_after_journal"] += 1
                if any(f.pid == line["pid"] and f.start <= t <= f.end for f in faults):
                    fig["in_flight_at_faults"] += 1
                else:
                    v.append(
                        f"I4 run {run_id}: {step} by pid {line['pid']} token {token} was "
                        "wasted (another claimant journaled it) with no fault on that pid"
                    )
    if fig["dup_step_execs"] > fig["in_flight_at_faults"]:
        v.append(
            f"I4 {fig['dup_step_execs']} duplicate step executions > "
            f"{fig['in_flight_at_faults']} in flight on fault victims"
        )
    if fig["dup_step_execs"] > len(faults) * max_in_flight:
        v.append(
            f"I4 {fig['dup_step_execs']} duplicate step executions > {len(faults)} faults "
            f"x {max_in_flight} runs in flight per worker"
        )
    report.figures = {k: fig.get(k, 0) for k in FIGURES}
    return report


def main(argv: list[str] | None = None) -> int:
    """Re-check a test's artifacts: DIR holds chaos.db, ledger.jsonl, expected.json and
    faults.json (written by the fault suite)."""
    from pyrula.workflows.stores.sqlite import SqliteStore

    parser = argparse.ArgumentParser(description="pyrula chaos checker")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--max-in-flight", type=int, default=4)
    args = parser.parse_args(argv)
    directory: Path = args.directory
    expected = json.loads((directory / "expected.json").read_text())
    faults_path = directory / "faults.json"
    faults = [
        FaultWindow(**f)
        for f in (json.loads(faults_path.read_text()) if faults_path.exists() else [])
    ]

    async def snap() -> Snapshot:
        store = SqliteStore(directory / "chaos.db")
        try:
            return await take_snapshot(store, expected)
        finally:
            await store.close()

    report = check(
        expected=expected,
        ledger=read_ledger(directory / "ledger.jsonl"),
        snapshot=asyncio.run(snap()),
        faults=faults,
        max_in_flight=args.max_in_flight,
    )
    print(report.text(limit=1000))
    return 0 if report.ok else 1


def fault_dicts(faults: Iterable[FaultWindow]) -> list[dict[str, Any]]:
    return [asdict(f) for f in faults]


if __name__ == "__main__":
    sys.exit(main())
