"""Celery 5, Dramatiq and pyrula (through pyrula_compat) side by side on one valkey-server.

Rounds interleave the systems (the order rotates each round) so that every ratio is
taken between figures of the same round, under the same noise. In each round, for each
system: empty the server, start its workers (Celery: ``celery worker --pool prefork -c
2``; Dramatiq: ``--processes 2 --threads 4``; pyrula: two ``pyrula worker -A``
processes), wait until they say they are ready, run the client phases in a fresh
process (``client.py``), stop the workers by PID. The table gives each figure's median
over the rounds with its range, and the per-round ratios to Celery.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from celery_compare import procs, report

PACKAGE = Path(__file__).resolve().parent
BENCH = PACKAGE.parent
SYSTEMS = ("celery", "dramatiq", "pyrula")


def check_tasks_are_one_file() -> None:
    """``pyrula_tasks.py`` must be ``celery_tasks.py`` with only the imports rewritten."""
    celery_text = (PACKAGE / "celery_tasks.py").read_text()
    rewritten = "\n".join(
        line.replace("celery", "pyrula_compat", 1)
        if line.startswith(("from celery", "import celery"))
        else line
        for line in celery_text.split("\n")
    )
    if rewritten != (PACKAGE / "pyrula_tasks.py").read_text():
        raise SystemExit(
            "pyrula_tasks.py differs from celery_tasks.py beyond the import lines: the "
            "comparison must run the same tasks"
        )


def environment(system: str, url: str, args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(BENCH)]
    if args.deps and not system.startswith("pyrula"):
        paths.insert(0, args.deps)
    if args.c_parsers:
        paths.insert(0, args.c_parsers)
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["BENCH_VALKEY_URL"] = url
    env.pop("CELERY_BROKER_URL", None)
    env.pop("CELERY_RESULT_BACKEND", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def take_snapshot() -> str:
    """Copy ``pyrula`` and ``pyrula_compat`` as they are now to a temporary directory,
    which every pyrula process of this comparison runs from; print the store's digest."""
    root = tempfile.mkdtemp(prefix="bench-pyrula-code-")
    for package in ("pyrula", "pyrula_compat"):
        shutil.copytree(BENCH.parent / package, Path(root) / package,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    digest = hashlib.sha256()
    for path in sorted((Path(root) / "pyrula/workflows/stores/valkey").rglob("*")):
        if path.is_file():
            digest.update(path.read_bytes())
    compat = hashlib.sha256()
    for path in sorted((Path(root) / "pyrula_compat").rglob("*.py")):
        compat.update(path.read_bytes())
    print(f"   pyrula code snapshot: stores/valkey sha256 {digest.hexdigest()[:12]}, "
          f"pyrula_compat sha256 {compat.hexdigest()[:12]}")  # fmt: skip
    return root


def run_segment(
    system: str, server: procs.ValkeyServer, config: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    env = environment(system, server.url, args)
    logdir = Path(tempfile.mkdtemp(prefix=f"bench-{system}-"))
    variant = args.variants.get(system.partition("@")[2]) if "@" in system else None
    code_dirs = os.pathsep.join(d for d in (variant, args.snapshot) if d) or None
    server.flush()
    try:
        workers = procs.start_workers(
            system.partition("@")[0], env, logdir, args.pyrula_processes, code_dirs,
            shlex.split(args.pyrula_args),
        )  # fmt: skip
        try:
            time.sleep(args.settle)
            full = {**config, "url": server.url, "worker_pids": workers.pids,
                    "server_pid": server.pid}  # fmt: skip
            runner = ["-m", "celery_compare.variant", code_dirs] if code_dirs else ["-m"]
            client = subprocess.run(
                [sys.executable, *runner, "celery_compare.client", system, "--config",
                 json.dumps(full)],
                env=env, cwd=logdir, capture_output=True, text=True, timeout=args.segment_timeout,
            )  # fmt: skip
            if client.returncode != 0:
                raise RuntimeError(f"{system} client failed:\n{client.stderr[-3000:]}")
            result: dict[str, Any] = json.loads(client.stdout.strip().splitlines()[-1])
            return result
        finally:
            workers.stop()
    finally:
        if args.keep_logs:
            print(f"   logs of {system}: {logdir}")
        else:
            shutil.rmtree(logdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/celery_compare", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5, help="rounds of all systems")
    parser.add_argument("--tasks", type=int, default=3000, help="no-op tasks per round")
    parser.add_argument("--round-trips", type=int, default=300, help="sequential delay().get()")
    parser.add_argument("--chains", type=int, default=500, help="three-task chains per round")
    parser.add_argument("--retries", type=int, default=500, help="fail-once tasks per round")
    parser.add_argument("--countdowns", type=int, default=100, help="countdown tasks per round")
    parser.add_argument("--countdown", type=float, default=1.0, help="first countdown, s")
    parser.add_argument(
        "--spacing", type=float, default=0.02, help="countdown step between tasks, s"
    )
    parser.add_argument("--warmup", type=int, default=200, help="untimed tasks first")
    parser.add_argument("--idle-seconds", type=float, default=2.0, help="idle phase length")
    parser.add_argument("--settle", type=float, default=1.0, help="pause after workers ready")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--pyrula-processes", type=int, default=2, help="pyrula worker processes")
    parser.add_argument(
        "--pyrula-args", default="", help="extra `pyrula worker` flags, e.g. "
        "'--claim-poll-interval 0.5'",
    )  # fmt: skip
    parser.add_argument("--segment-timeout", type=float, default=300.0, help="per client run, s")
    parser.add_argument(
        "--deps", default=os.environ.get("PYRULA_BENCH_DEPS"),
        help="a directory holding Celery (pip install --target DIR -r "
        "bench/requirements-compare.txt); put first on the Celery and Dramatiq processes' "
        "PYTHONPATH [env PYRULA_BENCH_DEPS]",
    )  # fmt: skip
    parser.add_argument(
        "--c-parsers", metavar="DIR",
        help="a directory holding hiredis and libvalkey (pip install --target DIR hiredis "
        "libvalkey), put first on every process's PYTHONPATH: each client library then "
        "parses replies in C",
    )  # fmt: skip
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=DIR",
        help="also run pyrula with the pyrula_compat package in DIR, as system pyrula@NAME "
        "(e.g. the last commit's: git archive HEAD pyrula_compat | tar -x -C DIR)",
    )  # fmt: skip
    parser.add_argument(
        "--monitored",
        type=int,
        default=200,
        help="tasks run under MONITOR after the timed phases, to count round trips (0: off)",
    )
    parser.add_argument(
        "--no-snapshot", dest="snapshot", action="store_false",
        help="run pyrula from the working tree as it is at each segment's start, not from "
        "a copy taken when the comparison started",
    )  # fmt: skip
    parser.add_argument("--json", help="also write every round's raw figures to this file")
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker logs")
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    args.variants = dict(v.split("=", 1) for v in args.variant)
    systems += [f"pyrula@{name}" for name in args.variants]
    check_tasks_are_one_file()
    if "celery" in systems and not args.deps and importlib.util.find_spec("celery") is None:
        raise SystemExit("Celery is not importable: see bench/README.md (--deps DIR)")
    config = {
        "tasks": args.tasks, "round_trips": args.round_trips, "chains": args.chains,
        "retries": args.retries, "countdowns": args.countdowns, "countdown": args.countdown,
        "spacing": args.spacing, "warmup": args.warmup, "idle_seconds": args.idle_seconds,
        "monitored": args.monitored,
    }  # fmt: skip
    print("== Celery 5, Dramatiq and pyrula_compat side by side on one valkey-server")
    print(
        f"   {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} | "
        f"Python {platform.python_version()} | {os.cpu_count()} cores | "
        f"load average {os.getloadavg()[0]:.2f} | {json.dumps(config)}"
    )
    server = procs.ValkeyServer()
    rounds: list[dict[str, dict[str, Any]]] = []
    started = time.monotonic()
    args.snapshot = take_snapshot() if args.snapshot else None
    try:
        server.start()
        for r in range(args.rounds):
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            results: dict[str, dict[str, Any]] = {}
            for system in order:
                t0 = time.monotonic()
                try:
                    results[system] = run_segment(system, server, config, args)
                except Exception as exc:  # one failed segment must not lose the rest
                    print(f"   round {r + 1}: {system} FAILED: {exc}")
                    continue
                summary = report.summarize(results[system])
                print(
                    f"   round {r + 1} {system:9s} {time.monotonic() - t0:5.1f}s  "
                    + "  ".join(f"{k} {v:.4g}" for k, v in list(summary.items())[:6]),
                    flush=True,
                )
            rounds.append(results)
    finally:
        server.cleanup()
        if args.snapshot:
            shutil.rmtree(args.snapshot, ignore_errors=True)
    if args.c_parsers:
        print("   with C reply parsers (hiredis, libvalkey) for every system")
    print(f"   {args.rounds} rounds in {time.monotonic() - started:.0f}s, "
          f"load average now {os.getloadavg()[0]:.2f}\n")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"config": config, "rounds": rounds}, indent=1))
    report.print_tables(rounds, systems)
    return 0
