"""The comparison's figures and tables: medians over rounds with ranges, per-round ratios,
the issue's targets, and where each system's server commands go."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from common import percentile

FIGURES: list[tuple[str, str, bool]] = [
    # (name, unit, higher is better)
    ("no-op tasks/s", "/s", True),
    ("round trip p50", "ms", False),
    ("round trip p99", "ms", False),
    ("3-task chains/s", "/s", True),
    ("fail-once+retry tasks/s", "/s", True),
    ("countdown lateness p50", "ms", False),
    ("countdown lateness p99", "ms", False),
    ("CPU/task, workers", "ms", False),
    ("CPU/task, client", "ms", False),
    ("CPU/task, server", "ms", False),
    ("CPU/task, total", "ms", False),
    ("commands/task", "", False),
    ("round trips/task", "", False),
    ("commands in scripts/task", "", False),
    ("commands/chain", "", False),
    ("commands/retried task", "", False),
    ("idle commands/s", "/s", False),
    ("idle worker CPU", "ms/s", False),
]


def summarize(r: dict[str, Any]) -> dict[str, float]:
    """One system's figures of one round."""
    t, rt, late, idle = r["throughput"], r["round_trip_s"], r["lateness_s"], r["idle"]
    return {
        "no-op tasks/s": t["units"] / t["seconds"],
        "round trip p50": 1000 * percentile(rt, 50),
        "round trip p99": 1000 * percentile(rt, 99),
        "3-task chains/s": r["chains"]["units"] / r["chains"]["seconds"],
        "fail-once+retry tasks/s": r["retry"]["units"] / r["retry"]["seconds"],
        "countdown lateness p50": 1000 * percentile(late, 50),
        "countdown lateness p99": 1000 * percentile(late, 99),
        "CPU/task, workers": t["worker_ms"],
        "CPU/task, client": t["client_ms"],
        "CPU/task, server": t["server_ms"],
        "CPU/task, total": t["worker_ms"] + t["client_ms"] + t["server_ms"],
        "commands/task": t["commands"],
        "round trips/task": r.get("monitor", {}).get("round_trips", math.nan),
        "commands in scripts/task": r.get("monitor", {}).get("inside_scripts", math.nan),
        "commands/chain": r["chains"]["commands"],
        "commands/retried task": r["retry"]["commands"],
        "idle commands/s": idle["commands"],
        "idle worker CPU": idle["worker_ms"] / idle["seconds"],
    }


def _spread(values: Sequence[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    med = statistics.median(values)
    fmt = _fmt(med)
    if len(values) == 1:
        return fmt(med)
    return f"{fmt(med)} ({fmt(min(values))}-{fmt(max(values))})"


def _fmt(value: float) -> Callable[[float], str]:
    if abs(value) >= 100:
        return lambda v: f"{v:,.0f}"
    if abs(value) >= 10:
        return lambda v: f"{v:.1f}"
    return lambda v: f"{v:.2f}"


def _row(cells: Sequence[str], widths: Sequence[int]) -> None:
    print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                    enumerate(zip(cells, widths, strict=True))))  # fmt: skip


def print_tables(rounds: list[dict[str, dict[str, Any]]], systems: Sequence[str]) -> None:
    per = [{s: summarize(res) for s, res in r.items()} for r in rounds]
    print(f"Medians over {len(rounds)} round(s), (min-max) in brackets")
    widths = [26] + [24] * len(systems)
    _row(["", *systems], widths)
    for name, unit, _ in FIGURES:
        cells = [_spread([p[s][name] for p in per if s in p]) for s in systems]
        _row([f"{name} {unit}".rstrip(), *cells], widths)
    candidates = [(s, "celery") for s in systems if s != "celery"] + [("pyrula", "dramatiq")]
    candidates += [("pyrula", s) for s in systems if s.startswith("pyrula@")]
    pairs = [(a, b) for a, b in candidates if a in systems and b in systems]
    if pairs:
        print("\nRatios within each round: median (min-max)")
        widths = [26] + [24] * len(pairs)
        _row(["", *(f"{a} / {b}" for a, b in pairs)], widths)
        for name, _unit, _ in FIGURES:
            cells = []
            for a, b in pairs:
                ratios = [p[a][name] / p[b][name] for p in per
                          if a in p and b in p and p[b][name]]  # fmt: skip
                cells.append("x" + _spread(ratios) if ratios else "-")
            _row([name, *cells], widths)
    _targets(per)
    _commands(rounds, systems)


def _targets(per: list[dict[str, dict[str, float]]]) -> None:
    both = [p for p in per if {"pyrula", "celery"} <= set(p)]
    if not both:
        return
    checks: list[tuple[str, Callable[[dict[str, dict[str, float]]], bool]]] = [
        ("throughput >= 3.4x Celery", lambda p: p["pyrula"]["no-op tasks/s"]
         >= 3.4 * p["celery"]["no-op tasks/s"]),
        ("round trip p50 <= Celery", lambda p: p["pyrula"]["round trip p50"]
         <= p["celery"]["round trip p50"]),
        ("countdown lateness p50 <= Celery", lambda p: p["pyrula"]["countdown lateness p50"]
         <= p["celery"]["countdown lateness p50"]),
        ("commands/task <= Celery / 2", lambda p: p["pyrula"]["commands/task"]
         <= p["celery"]["commands/task"] / 2),
        ("total CPU/task < 1 ms", lambda p: p["pyrula"]["CPU/task, total"] < 1.0),
    ]  # fmt: skip
    if all("dramatiq" in p for p in both):
        checks[1:1] = [
            ("throughput >= Dramatiq", lambda p: p["pyrula"]["no-op tasks/s"]
             >= p["dramatiq"]["no-op tasks/s"]),
            ("chains/s >= Dramatiq", lambda p: p["pyrula"]["3-task chains/s"]
             >= p["dramatiq"]["3-task chains/s"]),
        ]  # fmt: skip
    print("\nThe issue's targets for pyrula, checked in each round")
    for name, check in checks:
        met = sum(1 for p in both if check(p))
        verdict = "meets" if met == len(both) else ("MISSES" if met == 0 else "mixed")
        print(f"  {name:34s} {verdict:7s} in {met}/{len(both)} rounds")


def _commands(rounds: list[dict[str, dict[str, Any]]], systems: Sequence[str]) -> None:
    for title, path in (
        ("Server commands per no-op task by command, INFO commandstats (includes the "
         "commands Lua scripts run)", ("throughput", "by_command")),
        ("Round trips per no-op task by command, MONITOR (what clients sent)",
         ("monitor", "by_command")),
    ):  # fmt: skip
        print(f"\n{title}; median over rounds")
        for system in systems:
            tables = [r[system][path[0]][path[1]] for r in rounds
                      if system in r and path[0] in r[system]]  # fmt: skip
            if not tables:
                continue
            names = sorted({k for t in tables for k in t})
            meds = {k: statistics.median([t.get(k, 0.0) for t in tables]) for k in names}
            top = sorted(meds.items(), key=lambda kv: -kv[1])
            print(f"  {system:9s} " + ", ".join(f"{k} {v:.2f}" for k, v in top if v >= 0.01))
