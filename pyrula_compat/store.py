"""From Celery's broker and backend URLs to one pyrula store, and a client per store.

One store is queue and result backend. The broker URL picks it (``redis://``,
``rediss://``, ``valkey://`` -> ValkeyStore; ``sqlite://``, ``sqla+sqlite://``,
``db+sqlite://`` -> SqliteStore; ``memory://``); no broker means pyrula's default
(``PYRULA_STORE_URL`` or the embedded ``sqlite:///pyrula.db``). A result backend on the
same server is accepted (its database number is ignored); one naming another server is
an error, since results live with the runs.

Each process keeps one blocking ``WorkflowClient`` per store URL, shared by threads and
created on first use (so creating an app at import time opens nothing).

With ``PYRULA_POSTGRES_DSN`` set (the variable ``pyrula worker --postgres-dsn`` reads),
the client's store is an ArchivingStore over that Postgres archive, built as the
worker's is: ``AsyncResult`` of a task already moved to the archive reads its state and
result from there (not PENDING), and a repeat ``apply_async(task_id=...)`` of an archived
task returns it rather than running it again. A client never archives: only workers do.
"""

from __future__ import annotations

import logging
import os
import threading
from urllib.parse import urlsplit

from pyrula.workflows import ConfigurationError, RunRecord, open_store
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.archive.wrapping import (
    POSTGRES_DSN_ENV,
    postgres_dsn_from_env,
    with_archive,
)
from pyrula.workflows.stores.base import Store
from pyrula.workflows.sync import WorkflowClient
from pyrula_compat.exceptions import ImproperlyConfigured

log = logging.getLogger("pyrula_compat")

VALKEY_SCHEMES = frozenset({"redis", "rediss", "valkey", "valkeys", "unix"})
BROKERS_NOT_NEEDED = frozenset(
    {
        "amqp",
        "amqps",
        "pyamqp",
        "librabbitmq",
        "sqs",
        "qpid",
        "kafka",
        "filesystem",
        "consul",
        "zookeeper",
        "azureservicebus",
        "gcpubsub",
        "mongodb",
        "confluentkafka",
    }
)
IGNORED_BACKENDS = frozenset({"rpc", "disabled", "django-db", "django-cache", "cache"})

compat_registry = Registry()
"""Every task of every app, so clients find their rate limits (see ``Celery.task``)."""

_clients: dict[tuple[str, str | None], WorkflowClient] = {}
"""The process's clients by store URL and archive DSN."""
_lock = threading.Lock()
_warned: set[str] = set()


def _first(url: str | list[str] | tuple[str, ...] | None) -> str | None:
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if isinstance(url, str) and ";" in url:
        url = url.split(";", 1)[0]
    return url.strip() if isinstance(url, str) and url.strip() else None


def normalize(url: str) -> str:
    """A Celery URL as a pyrula store URL (``sqla+sqlite:///x.db`` -> ``sqlite:///x.db``)."""
    scheme = urlsplit(url).scheme.lower()
    for prefix in ("sqla+", "db+"):
        if scheme.startswith(prefix):
            url, scheme = url[len(prefix) :], scheme[len(prefix) :]
    if scheme == "redis+socket":
        url = "unix://" + url[len("redis+socket://") :]
    elif scheme == "memory" and not url.startswith("memory://"):
        url = "memory://"
    return url


def _server(url: str) -> tuple[str, str]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in VALKEY_SCHEMES:
        host = parts.hostname or "localhost"
        return ("valkey", f"{host}:{parts.port or 6379}" if scheme != "unix" else parts.path)
    if scheme == "sqlite":
        return ("sqlite", os.path.abspath(url[len("sqlite:///") :]))
    return (scheme, url)


def masked(url: str) -> str:
    """``url`` with only its password masked, as Celery's ``maybe_sanitize_url`` shows a
    broker URL: ``amqp://u:secret@h//`` reads ``amqp://u:**@h//``; a URL without a
    password (``amqp://guest@localhost//``) is shown as it is."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority = rest[:authority_end]
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:**@{host}{rest[authority_end:]}"


def _check_broker(url: str) -> str:
    scheme = urlsplit(url).scheme.lower()
    if scheme in BROKERS_NOT_NEEDED or scheme.split("+")[0] in BROKERS_NOT_NEEDED:
        raise ImproperlyConfigured(
            f"broker {masked(url)!r}: pyrula needs no separate message broker. Its "
            "store is the queue and the result backend in one: set broker_url to "
            "redis://host:6379/0 (Valkey or Redis), sqlite:///path.db, or leave it unset "
            "for the embedded SQLite store, and retire the broker."
        )
    normalized = normalize(url)
    if urlsplit(normalized).scheme.lower() not in VALKEY_SCHEMES | {"sqlite", "memory"}:
        raise ImproperlyConfigured(
            f"broker URL {masked(url)!r} is not a store pyrula can use: expected redis://, "
            "rediss://, valkey://, sqlite:///path.db (also sqla+sqlite:// and "
            "db+sqlite://) or memory://"
        )
    return normalized


def store_url(broker: object, backend: object) -> str | None:
    """The store URL for a broker and result backend (env vars already applied)."""
    broker_url = _first(broker)  # type: ignore[arg-type]
    backend_url = _first(backend)  # type: ignore[arg-type]
    if broker_url is not None:
        broker_url = _check_broker(broker_url)
    if backend_url is not None:
        scheme = urlsplit(backend_url).scheme.lower() or backend_url.lower()
        if scheme in IGNORED_BACKENDS or backend_url.lower() in IGNORED_BACKENDS:
            if backend_url not in _warned:
                _warned.add(backend_url)
                log.warning(
                    "result backend %r ignored: results are kept in the pyrula store",
                    backend_url,
                )
            return broker_url
        if scheme.startswith("cache+"):
            return broker_url
        try:
            backend_store = _check_broker(backend_url)
        except ImproperlyConfigured:
            raise ImproperlyConfigured(
                f"result backend {masked(backend_url)!r} is not a store pyrula can use; results "
                "live in the same store as the runs (the broker URL), so drop the backend "
                "setting or make it the broker's URL"
            ) from None
        if broker_url is None:
            return backend_store
        if _server(backend_store) != _server(broker_url):
            raise ImproperlyConfigured(
                f"result backend {masked(backend_url)!r} names a different server than the "
                f"broker {masked(broker_url)!r}: pyrula keeps runs and results in one store, "
                "so both must name the same one (or drop the result backend setting)"
            )
    return broker_url


def client_for(url: str | None) -> WorkflowClient:
    """The process's blocking client for the store at ``url`` (None: pyrula's default),
    over the Postgres archive ``PYRULA_POSTGRES_DSN`` names when it is set."""
    dsn = postgres_dsn_from_env()
    key = (url or "", dsn)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = WorkflowClient(
                _open(url, dsn), registry=compat_registry, require_registered=False
            )
            _clients[key] = client
        return client


def _open(url: str | None, dsn: str | None) -> Store:
    """The client's store: the one at ``url``, wrapped as ``pyrula worker`` wraps its own
    when ``dsn`` names an archive (reads fall through to it, archived ids stay taken)."""
    store = open_store(url)
    try:
        return with_archive(store, dsn)
    except ConfigurationError as exc:
        raise ImproperlyConfigured(
            f"{POSTGRES_DSN_ENV} is set, so results are read through the Postgres archive "
            f"it names, but: {exc}. Unset {POSTGRES_DSN_ENV} in this process to read the "
            "live store only (results of archived tasks then read as PENDING)"
        ) from exc


def wait_record(client: WorkflowClient, run_id: str, timeout: float | None) -> RunRecord:
    """The run once it has ended, or as it is when ``timeout`` passes: the store's
    ``wait_run`` (in this thread on a single-node Valkey store), so a result costs one
    call when the run has ended (no second read of the record after the wait). Raises
    RunNotFound for an unknown id."""
    return client.wait_run(run_id, timeout)


def close_clients() -> None:
    """Close every client this process opened (tests; the CLI at exit)."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()
