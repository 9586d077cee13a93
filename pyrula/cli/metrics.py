"""Prometheus metrics of ``pyrula worker --metrics-port N`` (the ``metrics`` extra:
``prometheus_client``), served on that port's ``/metrics`` and the dashboard's.

:class:`PrometheusMetrics` is a :class:`~pyrula.workflows.telemetry.Instrument`: the
worker's runs and steps move its counters and histograms, under pyrula's names and the
names celery-exporter dashboards read (``celery_task_*`` labelled ``name``,
``hostname``, ``queue_name``). :class:`QueueSampler` reads the store's queued runs every
few seconds for ``pyrula_queue_depth``, ``pyrula_oldest_queued_age_seconds`` and
``celery_queue_length``.

**The prefork pool.** Each pool process is a worker of its own, and the supervisor
serves the port. The processes write their samples with prometheus_client's
multiprocess mode into a directory of this supervisor's (:func:`multiprocess_dir`,
``PROMETHEUS_MULTIPROC_DIR`` in their environment), and the supervisor's ``/metrics``
sums them (:func:`pool_registry`). Chosen over reporting on the supervisor's socket pair
because a sample costs an mmap write in the process (no system call, no line per step
for the supervisor to parse), histograms need no aggregation code of ours, and the
counters of a pool process that was replaced stay in the sums (its file stays), so
totals never go down when ``--max-tasks-per-child`` recycles a process. The gauges of a
process that died are dropped at the next scrape.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pyrula.workflows import telemetry
from pyrula.workflows.errors import PyrulaError
from pyrula.workflows.records import RunStatus
from pyrula.workflows.stores.base import Store

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from pyrula.workflows.engine.execution import RunExecution
    from pyrula.workflows.records import Lease, NewRun, RecoveryReport
    from pyrula.workflows.registry import Registry

log = logging.getLogger("pyrula.cli.metrics")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
SAMPLE_INTERVAL = 5.0
"""Seconds between two reads of the store's queued runs."""
SAMPLE_LIMIT = 100_000
"""Queued runs read at most per sample."""
PRIORITY = "0"
"""The priority label of every queue (runs have no priorities)."""
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class MetricsUnavailable(PyrulaError):
    """prometheus_client is not installed."""


def available() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def require() -> None:
    if not available():
        raise MetricsUnavailable(
            "Prometheus metrics need prometheus_client: pip install 'pyrula[metrics]'"
        )


class PrometheusMetrics(telemetry.Instrument):
    """The worker's metrics. They are recorded in a registry of their own (in a process
    with ``PROMETHEUS_MULTIPROC_DIR`` set, a pool process, into its files) and exposed in
    ``registry``, celery-exporter's names derived from them at each scrape
    (:class:`WithCeleryNames`): a run costs each sample once."""

    def __init__(self, hostname: str = "") -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.hostname = hostname or socket.gethostname()
        self.recorded = r = CollectorRegistry()
        self.registry = CollectorRegistry()
        """What ``/metrics`` shows: the recorded series and their celery-exporter names."""
        self.registry.register(WithCeleryNames(r.collect, self.hostname))
        wq = ("workflow", "queue")
        celery = ("name", "hostname", "queue_name")

        def counter(name: str, text: str, labels: tuple[str, ...] = ()) -> Any:
            return Counter(name, text, labels, registry=r)

        self.started = counter("pyrula_runs_started", "Run executions started.", wq)
        self.ended = counter("pyrula_runs_ended", "Run executions ended, by how.", (*wq, "status"))
        self.duration = Histogram(
            "pyrula_run_duration_seconds", "Run execution time.", wq, registry=r, buckets=BUCKETS
        )
        self.step_duration = Histogram(
            "pyrula_step_duration_seconds", "Step attempt time.", (*wq, "step"), registry=r,
            buckets=BUCKETS,
        )  # fmt: skip
        self.step_retries = counter(
            "pyrula_step_retries", "Failed step attempts that are retried.", (*wq, "step")
        )
        self.in_flight = Gauge(
            "pyrula_runs_in_flight", "Runs executing now.", wq, registry=r,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.claim_latency = Histogram(
            "pyrula_claim_latency_seconds", "From a run's due time to its claim.", wq,
            registry=r, buckets=BUCKETS,
        )  # fmt: skip
        self.recoveries = counter("pyrula_recoveries", "Runs requeued after their lease expired.")
        self.dead = counter("pyrula_dead_lettered", "Runs dead-lettered by recovery.")
        self.fires = counter("pyrula_schedule_fires", "Runs fired by schedules.", ("workflow",))
        self.sent = counter("celery_task_sent", "Tasks sent (submitted) here.", celery)
        self.retried = counter("celery_task_retried", "Tasks retried.", celery)
        self._children: dict[tuple[str, ...], tuple[Any, ...]] = {}
        self._queues: dict[str, str] = {}
        self._labelled: dict[tuple[Any, ...], Any] = {}
        """Labelled series by (metric, labels...): ``labels()`` costs more than a sample."""

    def _run_series(self, workflow: str, queue: str) -> tuple[Any, ...]:
        """The labelled children of a workflow's series, made once."""
        key = (workflow, queue)
        series = self._children.get(key)
        if series is None:
            series = (
                self.started.labels(*key), self.duration.labels(*key),
                self.in_flight.labels(*key), self.claim_latency.labels(*key),
                self.retried.labels(workflow, self.hostname, queue),
            )  # fmt: skip
            self._children[key] = series
        return series

    # -- Instrument ----------------------------------------------------------------------
    def submitting(self, new: NewRun) -> NewRun:
        queue = telemetry.queue_of(new.workflow)
        self._series(self.sent, new.workflow, self.hostname, queue).inc()
        return new

    def run_started(self, lease: Lease, queue: str) -> Any:
        run = lease.run
        started, _, in_flight, latency, _ = self._run_series(run.workflow, queue)
        started.inc()
        in_flight.inc()
        latency.observe(max(0.0, time.time() - run.available_at))
        return time.perf_counter()

    def run_ended(self, scope: Any, lease: Lease, queue: str, end: str) -> None:
        elapsed = time.perf_counter() - scope
        workflow = lease.run.workflow
        _, duration, in_flight, _, retried = self._run_series(workflow, queue)
        in_flight.dec()
        duration.observe(elapsed)
        self._series(self.ended, workflow, queue, end).inc()
        if end == "suspended" and queue == telemetry.CELERY_QUEUE:
            retried.inc()  # a Celery task suspends only to wait for its retry

    def step_started(self, execution: RunExecution, name: str, attempt: int) -> Any:
        return time.perf_counter()

    def _series(self, metric: Any, *labels: str) -> Any:
        series = self._labelled.get((metric, *labels))
        if series is None:
            series = self._labelled[(metric, *labels)] = metric.labels(*labels)
        return series

    def _queue(self, execution: RunExecution) -> str:
        queue = self._queues.get(execution.workflow)
        if queue is None:
            queue = self._queues[execution.workflow] = queue_in(
                execution.registry, execution.workflow
            )
        return queue

    def step_ended(self, scope: Any, execution: RunExecution, name: str, error: Any) -> None:
        elapsed = time.perf_counter() - scope
        series = self._labelled.get((self.step_duration, execution.workflow, name))
        if series is None:
            series = self.step_duration.labels(execution.workflow, self._queue(execution), name)
            self._labelled[(self.step_duration, execution.workflow, name)] = series
        series.observe(elapsed)

    def step_retrying(self, execution: RunExecution, name: str, attempt: int) -> None:
        workflow = execution.workflow
        queue = self._queue(execution)
        self.step_retries.labels(workflow, queue, name).inc()
        if queue != telemetry.CELERY_QUEUE:
            self._series(self.retried, workflow, self.hostname, queue).inc()

    def recovered(self, report: RecoveryReport) -> None:
        self.recoveries.inc(len(report.requeued))
        self.dead.inc(len(report.dead))

    def schedule_fired(self, workflow: str) -> None:
        self.fires.labels(workflow).inc()


DERIVED_COUNTERS = {
    "pyrula_runs_started": (("celery_task_received", "Tasks received (claimed)."),
                            ("celery_task_started", "Tasks started.")),
}  # fmt: skip
DERIVED_ENDS = {"completed": ("celery_task_succeeded", "Tasks succeeded."),
                "failed": ("celery_task_failed", "Tasks failed.")}  # fmt: skip


class WithCeleryNames:
    """A collector: the families ``source()`` gives, and celery-exporter's series made
    from them (``celery_task_received``/``started`` from ``pyrula_runs_started``,
    ``succeeded``/``failed`` from ``pyrula_runs_ended``, ``celery_task_runtime`` from
    ``pyrula_run_duration_seconds``, ``celery_worker_tasks_active`` from
    ``pyrula_runs_in_flight``), labelled ``name``, ``hostname``, ``queue_name``."""

    def __init__(self, source: Callable[[], Iterable[Metric]], hostname: str) -> None:
        self.source = source
        self.hostname = hostname

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        labels = ["name", "hostname", "queue_name"]
        derived: dict[str, Any] = {}

        def family(kind: Any, name: str, text: str, names: list[str] = labels) -> Any:
            if name not in derived:
                derived[name] = kind(name, text, labels=names)
            return derived[name]

        for metric in self.source():
            yield metric
            totals = [s for s in metric.samples if s.name == metric.name + "_total"]
            for name, text in DERIVED_COUNTERS.get(metric.name, ()):
                out = family(CounterMetricFamily, name, text)
                for sample in totals:
                    out.add_metric(self._labels(sample.labels), sample.value)
            if metric.name == "pyrula_runs_ended":
                for status, (name, text) in DERIVED_ENDS.items():
                    out = family(CounterMetricFamily, name, text)
                    for sample in totals:
                        if sample.labels.get("status") == status:
                            out.add_metric(self._labels(sample.labels), sample.value)
            elif metric.name == "pyrula_run_duration_seconds":
                out = family(HistogramMetricFamily, "celery_task_runtime", "Task runtime, seconds.")
                for key, (buckets, total) in _histograms(metric).items():
                    out.add_metric([key[0], self.hostname, key[1]], buckets, total)
            elif metric.name == "pyrula_runs_in_flight":
                out = family(GaugeMetricFamily, "celery_worker_tasks_active",
                             "Tasks executing now.", ["hostname"])  # fmt: skip
                out.add_metric([self.hostname], sum(s.value for s in metric.samples))
        yield from derived.values()

    def _labels(self, labels: dict[str, str]) -> list[str]:
        return [labels.get("workflow", ""), self.hostname, labels.get("queue", "")]


def _histograms(metric: Metric) -> dict[tuple[str, str], tuple[list[tuple[str, float]], float]]:
    """A histogram family's buckets and sum per (workflow, queue)."""
    found: dict[tuple[str, str], tuple[list[tuple[str, float]], float]] = {}
    for sample in metric.samples:
        key = (sample.labels.get("workflow", ""), sample.labels.get("queue", ""))
        buckets, total = found.get(key, ([], 0.0))
        if sample.name.endswith("_bucket"):
            buckets.append((sample.labels["le"], sample.value))
        elif sample.name.endswith("_sum"):
            total = sample.value
        found[key] = (buckets, total)
    return found


def queue_in(registry: Registry, workflow: str) -> str:
    """The queue of ``workflow``'s runs, its definition looked up in ``registry``."""
    definition = registry.find(workflow)
    return telemetry.queue_of(workflow, None if definition is None else definition.fn)


class QueueSampler:
    """The store's queues, read every :data:`SAMPLE_INTERVAL` (:meth:`sample`), as a
    prometheus_client collector; also ``pyrula_worker_up`` and ``celery_worker_up``."""

    def __init__(self, registry: Registry, hostname: str = "", *, worker: bool = True) -> None:
        self.registry = registry
        self.worker = worker
        """Whether the ``*_worker_up`` series are ours (not on the dashboard's page)."""
        self.hostname = hostname or socket.gethostname()
        self.depth: dict[str, int] = {}
        self.oldest: dict[str, float] = {}
        self._sampled_at = 0.0

    async def sample(self, store: Store) -> None:
        """Read the queued runs (at most once per interval)."""
        if time.monotonic() - self._sampled_at < SAMPLE_INTERVAL:
            return
        self._sampled_at = time.monotonic()
        runs = await store.list_runs(status=RunStatus.QUEUED, limit=SAMPLE_LIMIT)
        now = await store.now()
        depth: dict[str, int] = {}
        oldest: dict[str, float] = {}
        for run in runs:
            if run.available_at > now:
                continue  # delayed: not waiting yet
            queue = queue_in(self.registry, run.workflow)
            depth[queue] = depth.get(queue, 0) + 1
            oldest[queue] = max(oldest.get(queue, 0.0), now - run.available_at)
        for queue in self.depth:
            depth.setdefault(queue, 0)  # a queue that emptied reads 0, not gone
        self.depth, self.oldest = depth, oldest

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        if self.worker:
            for name in ("pyrula_worker_up", "celery_worker_up"):
                up = GaugeMetricFamily(name, "1 while the worker serves.", labels=["hostname"])
                up.add_metric([self.hostname], 1.0)
                yield up
        depth = GaugeMetricFamily(
            "pyrula_queue_depth", "Runs due and waiting for a claim.", labels=["queue", "priority"]
        )
        length = GaugeMetricFamily(
            "celery_queue_length", "Tasks waiting in the queue.", labels=["queue_name"]
        )
        oldest = GaugeMetricFamily(
            "pyrula_oldest_queued_age_seconds", "How long the oldest due run has waited.",
            labels=["queue"],
        )  # fmt: skip
        for queue, count in sorted(self.depth.items()):
            depth.add_metric([queue, PRIORITY], float(count))
            length.add_metric([queue], float(count))
            oldest.add_metric([queue], self.oldest.get(queue, 0.0))
        yield depth
        yield length
        yield oldest


# -- serving -------------------------------------------------------------------------------
def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST


class DashboardMetrics:
    """The dashboard's ``/metrics``: the queues of its store (sampled at most every
    :data:`SAMPLE_INTERVAL`), and whatever instruments this process installed
    (``pyrula dev``'s worker)."""

    def __init__(self, store: Store, registry: Registry) -> None:
        from prometheus_client import CollectorRegistry

        self.store = store
        self.sampler = QueueSampler(registry, worker=False)
        self.registry = CollectorRegistry()
        self.registry.register(self.sampler)

    async def render(self) -> tuple[bytes, str]:
        await self.sampler.sample(self.store)
        body, content_type = render(self.registry)
        for instrument in telemetry.installed():
            if isinstance(instrument, PrometheusMetrics):
                body += render(instrument.registry)[0]
        return body, content_type


def multiprocess_dir() -> str:
    """Make the pool processes' metrics directory and name it in this process's
    environment (they inherit it); removed when the supervisor exits
    (:func:`remove_multiprocess_dir`)."""
    path = tempfile.mkdtemp(prefix="pyrula-metrics-")
    os.environ[MULTIPROC_ENV] = path
    return path


def remove_multiprocess_dir(path: str) -> None:
    os.environ.pop(MULTIPROC_ENV, None)
    shutil.rmtree(path, ignore_errors=True)


class _LiveFiles:
    """Before each scrape, drops the live gauges of pool processes that are gone."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterator[Metric]:
        from prometheus_client import multiprocess

        for name in glob.glob(os.path.join(self.path, "gauge_live*_*.db")):
            pid = name.rsplit("_", 1)[-1].removesuffix(".db")
            if pid.isdigit() and not _alive(int(pid)):
                multiprocess.mark_process_dead(int(pid), self.path)  # type: ignore[no-untyped-call]
        return iter(())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pool_registry(path: str, sampler: QueueSampler) -> CollectorRegistry:
    """The supervisor's registry: the pool processes' files, summed, and the queues."""
    from prometheus_client import CollectorRegistry, multiprocess

    registry = CollectorRegistry()
    registry.register(_LiveFiles(path))
    files = multiprocess.MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]
    registry.register(WithCeleryNames(files.collect, sampler.hostname))
    registry.register(sampler)
    return registry
