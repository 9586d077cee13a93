"""``pyrula worker --metrics-port N``: the worker's HTTP port for Kubernetes probes and
Prometheus.

* ``GET /healthz``: 200 while the process is alive and its HTTP thread answers (a
  liveness probe).
* ``GET /readyz``: 200 when the store answered the last probe and the worker's event
  loop is turning (it ran the probe recently); 503 with the reason otherwise (a
  readiness probe). Under a supervisor (the prefork pool, ``--max-tasks-per-child``),
  also when at least one worker process serves.
* ``GET /metrics``: the Prometheus text format (:mod:`pyrula.cli.metrics`), 404 without
  the ``metrics`` extra (``prometheus_client``).

A thread of the standard library's ``ThreadingHTTPServer`` serves it, on 127.0.0.1
unless ``--metrics-address`` says otherwise. The store probe runs on the worker's own
event loop (a single worker process: so a blocked loop turns the worker unready), or on
a thread of its own with its own store connection (a supervisor, whose children each
wait for the store).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import click

from pyrula.cli.render import CliUsageError
from pyrula.workflows.errors import PyrulaError
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.cli.health")

PROBE_INTERVAL = 1.0
"""Seconds between two store probes."""
PROBE_TIMEOUT = 3.0
"""Longest a probe waits for the store."""
STALE_AFTER = 10.0
"""A probe older than this (the loop that runs it stalled) makes the worker unready."""
DEFAULT_ADDRESS = "127.0.0.1"

Metrics = Callable[[], tuple[bytes, str]]
"""Renders the metrics: the body and its content type."""


class HealthState:
    """What ``/readyz`` reads. The probe writes it; ``serving`` says whether the worker
    (or, under a supervisor, one of its processes) serves."""

    def __init__(self, serving: Callable[[], bool] | None = None) -> None:
        self._lock = threading.Lock()
        self._answered_at: float | None = None
        self._probed_at: float | None = None
        self._error = "the store was not probed yet"
        self.serving: Callable[[], bool] = serving or (lambda: True)
        self.sample: Callable[[Store], Awaitable[None]] | None = None
        """Awaited after each probe the store answered (the queue metrics' sampler)."""

    def store_answered(self) -> None:
        with self._lock:
            self._answered_at = self._probed_at = time.monotonic()
            self._error = ""

    def store_failed(self, error: str) -> None:
        with self._lock:
            self._probed_at = time.monotonic()
            self._error = error

    def readiness(self) -> tuple[bool, str]:
        """(ready, why): the reason is what a probe's log shows."""
        with self._lock:
            probed, answered, error = self._probed_at, self._answered_at, self._error
        now = time.monotonic()
        if probed is None or now - probed > STALE_AFTER:
            return False, f"no store probe for over {STALE_AFTER:.0f}s: the event loop stalls"
        if error or answered is None:
            return False, f"the store does not answer: {error}"
        try:
            serving = self.serving()
        except RuntimeError:  # the supervisor's table changed while read: next probe
            serving = True
        if not serving:
            return False, "no worker process serves yet"
        return True, "ready"


async def probe_store(store: Store, state: HealthState) -> None:
    """Probe ``store`` (its clock: one round trip) every :data:`PROBE_INTERVAL` until
    cancelled, recording each answer or failure in ``state``."""
    while True:
        try:
            await asyncio.wait_for(store.now(), PROBE_TIMEOUT)
        except (PyrulaError, TimeoutError, OSError) as exc:
            state.store_failed(f"{type(exc).__name__}: {exc}")
        else:
            state.store_answered()
            if state.sample is not None:
                try:
                    await asyncio.wait_for(state.sample(store), PROBE_TIMEOUT)
                except (PyrulaError, TimeoutError, OSError) as exc:
                    log.debug("queue sample failed: %s", exc)
        await asyncio.sleep(PROBE_INTERVAL)


def probe_in_thread(open_probe_store: Callable[[], Store], state: HealthState) -> None:
    """Run :func:`probe_store` on a daemon thread with its own event loop and a store of
    its own (``open_probe_store()``): a supervisor's, which has no event loop."""

    async def probe() -> None:
        store = open_probe_store()
        try:
            await probe_store(store, state)
        finally:
            await store.close()

    threading.Thread(
        target=asyncio.run, args=(probe(),), name="pyrula-readiness", daemon=True
    ).start()


class HealthServer:
    """The HTTP server of ``/healthz``, ``/readyz`` and ``/metrics`` on a daemon thread."""

    def __init__(
        self, address: str, port: int, state: HealthState, metrics: Metrics | None = None
    ) -> None:
        self.state = state
        handler = _handler(state, metrics)
        try:
            self._server = ThreadingHTTPServer((address, port), handler)
        except OSError as exc:
            raise CliUsageError(
                f"--metrics-port {port}: cannot listen on {address}:{port} ({exc.strerror}); "
                "choose a free port"
            ) from None
        self._server.daemon_threads = True
        self.cleanups: list[Callable[[], None]] = []
        """Called after the server closed."""
        self.address, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="pyrula-health", daemon=True
        )

    def start(self) -> None:
        self._thread.start()
        log.info("health and metrics on http://%s:%s/ (healthz, readyz, metrics)",
                 self.address, self.port)  # fmt: skip

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        for cleanup in self.cleanups:
            cleanup()


def _handler(state: HealthState, metrics: Metrics | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "pyrula"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                ready, why = state.readiness()
                self._reply(200 if ready else 503, why.encode() + b"\n")
            elif path == "/metrics" and metrics is not None:
                body, content_type = metrics()
                self._reply(200, body, content_type)
            elif path == "/metrics":
                self._reply(404, b"metrics need prometheus_client: pip install 'pyrula[metrics]'\n")
            else:
                self._reply(404, b"not found: /healthz, /readyz, /metrics\n")

        def _reply(self, code: int, body: bytes, content_type: str = "text/plain") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("health: " + format, *args)

    return Handler


# -- the worker command's flags ----------------------------------------------------------
def health_options(command: Any) -> Any:
    """Add ``--metrics-port``, ``--metrics-address``, ``--startup-retries`` and
    ``--no-retry-on-startup`` to the worker command."""
    for decorator in reversed(
        (
            click.option(
                "--metrics-port",
                "metrics_port",
                type=click.IntRange(0, 65535),
                metavar="PORT",
                default=None,
                help="Serve /healthz, /readyz and /metrics (Prometheus) over HTTP on PORT "
                "(0: any free port). See docs/operations.md.",
            ),
            click.option(
                "--metrics-address",
                "metrics_address",
                metavar="ADDRESS",
                default=None,
                help=f"The address --metrics-port listens on [default: {DEFAULT_ADDRESS}].",
            ),
            click.option(
                "--startup-retries",
                "startup_retries",
                type=click.IntRange(min=0),
                metavar="N",
                default=None,
                help="Try the store this many more times, backing off, when it cannot be "
                "reached at start (0: forever). With -A: broker_connection_max_retries. "
                f"[default: {DEFAULT_STARTUP_RETRIES}]",
            ),
            click.option(
                "--no-retry-on-startup",
                "no_retry_on_startup",
                is_flag=True,
                default=False,
                help="Exit at once when the store cannot be reached at start. With -A: "
                "broker_connection_retry_on_startup = False.",
            ),
        )
    ):
        command = decorator(command)
    return command


DEFAULT_STARTUP_RETRIES = 100
"""Celery's ``broker_connection_max_retries`` default."""


def startup_retries(values: dict[str, Any], app: Any) -> int | None:
    """How many times a worker retries its store at start: 0 for none, None for
    forever. The flags win over a Celery app's ``broker_connection_retry_on_startup``
    (None, its default, retries) and ``broker_connection_max_retries`` (0 or None:
    forever)."""
    conf = app.conf if app is not None else {}
    if values.get("no_retry_on_startup"):
        return 0
    given = values.get("startup_retries")
    if given is None and conf.get("broker_connection_retry_on_startup") is False:
        return 0
    if given is None:
        given = conf.get("broker_connection_max_retries", DEFAULT_STARTUP_RETRIES)
    if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
        raise CliUsageError(
            f"-A: the app's broker_connection_max_retries must be a whole number (or None), "
            f"got {given!r}"
        )
    return given or None
