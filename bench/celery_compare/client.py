"""One system's client side of one round: the phases, timed and metered.

Run by the driver as ``python -m celery_compare.client SYSTEM --config JSON`` (with
``bench/`` on ``PYTHONPATH``, and Celery's install directory too for ``celery``). It
imports only that system's tasks module, so each system's client cost is its own
process's CPU. Prints one JSON object on its last line of stdout.

Around every phase it takes a snapshot: wall clock, this process's CPU (all threads,
``getrusage``), the worker processes' CPU (each started PID and its descendants, from
``/proc``), the valkey-server's CPU and ``INFO commandstats`` (calls of every command,
including those a Lua script makes; the ``INFO`` calls of this meter are left out).
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import sys
import time
from dataclasses import dataclass
from typing import Any

import valkey

from celery_compare.procs import cpu_seconds, tree_cpu

TIMEOUT = 120.0


# -- each system's way to call the same tasks ---------------------------------------------
class CeleryApi:
    """Celery's calling API: used for real Celery and for pyrula_compat alike."""

    def __init__(self, module: Any) -> None:
        self.m = module

    def noop(self) -> Any:
        return self.m.noop.delay()

    def chain(self) -> Any:
        m = self.m
        return (m.add.s(1, 1) | m.add.s(2) | m.add.s(3)).delay()

    def fail_once(self) -> Any:
        return self.m.fail_once.delay()

    def stamp(self, countdown: float) -> Any:
        return self.m.stamp.apply_async(countdown=countdown)

    def get(self, handle: Any) -> Any:
        return handle.get(timeout=TIMEOUT)


class DramatiqApi:
    def __init__(self, module: Any) -> None:
        self.m = module
        import dramatiq

        self.pipeline = dramatiq.pipeline

    def noop(self) -> Any:
        return self.m.noop.send()

    def chain(self) -> Any:
        m = self.m
        return self.pipeline([m.add.message(1, 1), m.add.message(2), m.add.message(3)]).run()

    def fail_once(self) -> Any:
        return self.m.fail_once.send()

    def stamp(self, countdown: float) -> Any:
        return self.m.stamp.send_with_options(delay=int(countdown * 1000))

    def get(self, handle: Any) -> Any:
        return handle.get_result(block=True, timeout=int(TIMEOUT * 1000))


def api_for(system: str) -> Any:
    system = system.split("@")[0]  # pyrula@NAME: a variant of the shim, same tasks
    module = importlib.import_module(f"celery_compare.{system}_tasks")
    return DramatiqApi(module) if system == "dramatiq" else CeleryApi(module)


# -- metering ------------------------------------------------------------------------------
@dataclass
class Snapshot:
    wall: float
    client: float
    worker: float
    server: float
    commands: dict[str, int]


class Meter:
    def __init__(self, url: str, worker_pids: list[int], server_pid: int) -> None:
        self.info = valkey.Valkey.from_url(url)
        self.worker_pids = worker_pids
        self.server_pid = server_pid

    def snap(self) -> Snapshot:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        stats = self.info.info("commandstats")
        commands = {
            name.removeprefix("cmdstat_"): int(value["calls"])
            for name, value in stats.items()
            if name != "cmdstat_info"
        }
        return Snapshot(
            wall=time.perf_counter(),
            client=usage.ru_utime + usage.ru_stime,
            worker=tree_cpu(self.worker_pids),
            server=cpu_seconds(self.server_pid),
            commands=commands,
        )

    @staticmethod
    def delta(a: Snapshot, b: Snapshot, units: int) -> dict[str, Any]:
        """Per-unit costs between two snapshots."""
        commands = {k: v - a.commands.get(k, 0) for k, v in b.commands.items()}
        commands = {k: v for k, v in commands.items() if v}
        return {
            "seconds": b.wall - a.wall,
            "units": units,
            "client_ms": 1000 * (b.client - a.client) / units,
            "worker_ms": 1000 * (b.worker - a.worker) / units,
            "server_ms": 1000 * (b.server - a.server) / units,
            "commands": sum(commands.values()) / units,
            "by_command": {k: round(v / units, 3) for k, v in sorted(commands.items())},
        }


# -- the phases ----------------------------------------------------------------------------
def submit_then_wait(api: Any, make: Any, count: int) -> list[Any]:
    handles = [make() for _ in range(count)]
    return [api.get(h) for h in handles]


def run(system: str, config: dict[str, Any]) -> dict[str, Any]:
    api = api_for(system)
    meter = Meter(config["url"], config["worker_pids"], config["server_pid"])
    out: dict[str, Any] = {"system": system}

    def metered(name: str, units: int, body: Any) -> Any:
        before = meter.snap()
        value = body()
        out[name] = Meter.delta(before, meter.snap(), units)
        return value

    # warm-up: connections, imports, every worker process touched; not measured
    submit_then_wait(api, api.noop, config["warmup"])
    for _ in range(20):
        api.get(api.noop())
    api.get(api.chain())

    n = config["tasks"]
    metered("throughput", n, lambda: submit_then_wait(api, api.noop, n))

    def round_trips() -> list[float]:
        times = []
        for _ in range(config["round_trips"]):
            start = time.perf_counter()
            api.get(api.noop())
            times.append(time.perf_counter() - start)
        return times

    out["round_trip_s"] = metered("round_trip", config["round_trips"], round_trips)

    chains = config["chains"]
    values = metered("chains", chains, lambda: submit_then_wait(api, api.chain, chains))
    assert all(v == 7 for v in values), values[:5]

    retries = config["retries"]
    values = metered("retry", retries, lambda: submit_then_wait(api, api.fail_once, retries))
    assert all(v == 1 for v in values), values[:5]

    count, base, spacing = config["countdowns"], config["countdown"], config["spacing"]

    def countdowns() -> list[float]:
        due, handles = [], []
        for i in range(count):
            delay = base + i * spacing
            due.append(time.time() + delay)
            handles.append(api.stamp(delay))
        return [api.get(h) - d for h, d in zip(handles, due, strict=True)]

    out["lateness_s"] = metered("countdown", count, countdowns)

    idle = config["idle_seconds"]
    metered("idle", 1, lambda: time.sleep(idle))
    out["idle"]["commands"] /= idle

    monitored = config["monitored"]
    if monitored:
        with Monitor(config["url"]) as watch:
            submit_then_wait(api, api.noop, monitored)
        out["monitor"] = watch.per(monitored)
    return out


class Monitor:
    """Counts, with ``MONITOR``, the commands clients send (round trips) apart from the
    commands Lua scripts run. Slows the server down: used only after the timed phases."""

    def __init__(self, url: str) -> None:
        import threading

        self.url = url
        self.top: dict[str, int] = {}
        self.inner = 0
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)

    def _listen(self) -> None:
        client = valkey.Valkey.from_url(self.url)
        with client.monitor() as monitor:
            self.ready.set()
            for command in monitor.listen():
                if self.stop.is_set():
                    break
                if command.get("client_type") == "lua" or command.get("client_address") == "lua":
                    self.inner += 1
                    continue
                words = str(command["command"]).split()
                name = words[0].upper() if words else "?"
                if name == "FCALL" and len(words) > 1:  # pyrula_<hash>_claim -> FCALL claim
                    name = "FCALL " + words[1].split("_", 2)[-1]
                self.top[name] = self.top.get(name, 0) + 1

    def __enter__(self) -> Monitor:
        self.thread.start()
        self.ready.wait(10)
        time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        valkey.Valkey.from_url(self.url).ping()  # one more line for the listener to see
        self.thread.join(10)

    def per(self, units: int) -> dict[str, Any]:
        top = {k: round(v / units, 3) for k, v in self.top.items() if k not in ("PING", "INFO")}
        return {
            "round_trips": sum(top.values()),
            "inside_scripts": self.inner / units,
            "by_command": dict(sorted(top.items(), key=lambda kv: -kv[1])),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("system", help="celery, dramatiq, pyrula or pyrula@VARIANT")
    parser.add_argument("--config", required=True, help="the phases' sizes, JSON")
    args = parser.parse_args()
    result = run(args.system, json.loads(args.config))
    sys.stdout.flush()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
