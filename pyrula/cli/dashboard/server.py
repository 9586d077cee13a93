"""The dev dashboard's HTTP server: GET only, one request per connection, asyncio streams.

It runs on the event loop of the worker it sits next to and reads through that worker's
Store object (``list_runs``, ``get_run``, ``load_journal``, ``list_workers``,
``list_schedules``), so it shows the same store the worker serves, on every store kind,
a ``memory://`` one included. It never writes.

Routes: ``/`` (runs, ``?status=&workflow=&owner=&limit=``), ``/runs/<id>``, ``/workers``,
``/schedules``; the same data as JSON under ``/api/runs``, ``/api/runs/<id>``,
``/api/workers``, ``/api/schedules``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from pyrula.cli import render
from pyrula.cli.dashboard import pages
from pyrula.cli.schedules import schedule_dict
from pyrula.workflows.inspection import is_alive
from pyrula.workflows.records import RunRecord, RunStatus, WorkerInfo
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.cli.dev")

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_HEADER_BYTES = 16 * 1024
READ_TIMEOUT_S = 10.0
"""A client that sends no complete request head within this is dropped."""


class HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Response:
    status: HTTPStatus
    content_type: str
    body: bytes


def run_json(run: RunRecord, now: float) -> dict[str, Any]:
    """``pyrula runs show --json``'s fields."""
    return render.run_dict(run, now)


def worker_json(worker: WorkerInfo, now: float) -> dict[str, Any]:
    return {
        "worker_id": worker.worker_id,
        "alive": is_alive(worker, now),
        "workflows": list(worker.workflows),
        "hostname": worker.hostname,
        "pid": worker.pid,
        "running": worker.running,
        "started_at": render.iso(worker.started_at, precise=True),
        "last_seen": render.iso(worker.last_seen, precise=True),
    }


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values and values[-1] != "" else None


class Dashboard:
    """Answers GET requests from ``store``; ``workflows`` fill the filter form."""

    def __init__(self, store: Store, workflows: Sequence[str], store_label: str) -> None:
        self.store = store
        self.workflows = list(workflows)
        self.store_label = store_label

    # -- routing ---------------------------------------------------------------------
    async def respond(self, method: str, target: str) -> Response:
        """The response to one request; errors become 4xx/5xx pages (JSON under /api)."""
        parts = urlsplit(target)
        path = parts.path
        as_json = path == "/api" or path.startswith("/api/")
        try:
            if method not in ("GET", "HEAD"):
                raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "the dashboard is read-only")
            route = path.removeprefix("/api") if as_json else path
            return await self._route(route or "/", parse_qs(parts.query), as_json)
        except HttpError as exc:
            return self._error(exc.status, exc.message, as_json)
        except Exception as exc:  # a store failure: show it, keep serving
            log.exception("dashboard request %s failed", path)
            message = f"{type(exc).__name__}: {exc}"
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, message, as_json)

    async def _route(self, path: str, query: dict[str, list[str]], as_json: bool) -> Response:
        if path in ("/", "/runs"):
            return await self._runs(query, as_json)
        if path.startswith("/runs/") and len(path) > len("/runs/"):
            return await self._run(unquote(path.removeprefix("/runs/")), as_json)
        if path == "/workers":
            listed, now = await self.store.list_workers(), await self.store.now()
            workers = [worker_json(w, now) for w in listed]
            if as_json:
                return self._json({"workers": workers})
            return self._html(pages.workers_page(workers, store=self.store_label))
        if path == "/schedules":
            workflow = _one(query, "workflow")
            records = await self.store.list_schedules(workflow=workflow)
            schedules = [schedule_dict(r) for r in records]
            if as_json:
                return self._json({"schedules": schedules})
            return self._html(pages.schedules_page(schedules, store=self.store_label))
        raise HttpError(HTTPStatus.NOT_FOUND, f"no page at {path}")

    async def _runs(self, query: dict[str, list[str]], as_json: bool) -> Response:
        status_text, workflow = _one(query, "status"), _one(query, "workflow")
        owner = query["owner"][-1] if "owner" in query else None  # '' is the default owner
        try:
            status = RunStatus(status_text) if status_text else None
            limit = int(_one(query, "limit") or DEFAULT_LIMIT)
        except ValueError:
            raise HttpError(
                HTTPStatus.BAD_REQUEST,
                "status must be one of "
                + ", ".join(s.value for s in RunStatus)
                + f"; limit a whole number from 1 to {MAX_LIMIT}",
            ) from None
        if not 1 <= limit <= MAX_LIMIT:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"limit must be from 1 to {MAX_LIMIT}")
        records = await self.store.list_runs(
            workflow=workflow, status=status, owner=owner, limit=limit
        )
        now = time.time()
        runs = [run_json(r, now) for r in records]
        if as_json:
            return self._json({"runs": runs})
        html = pages.runs_page(
            runs,
            status=status_text,
            workflow=workflow,
            workflows=self.workflows,
            store=self.store_label,
        )
        return self._html(html)

    async def _run(self, run_id: str, as_json: bool) -> Response:
        record = await self.store.get_run(run_id)
        if record is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no run with id {run_id!r}")
        journal = [render.entry_dict(e) for e in await self.store.load_journal(run_id)]
        run = run_json(record, time.time())
        if as_json:
            return self._json({"run": run, "journal": journal})
        return self._html(pages.run_page(run, journal, store=self.store_label))

    # -- bodies ----------------------------------------------------------------------
    def _json(self, document: Any, status: HTTPStatus = HTTPStatus.OK) -> Response:
        body = (render.to_json(document) + "\n").encode()
        return Response(status, "application/json; charset=utf-8", body)

    def _html(self, text: str, status: HTTPStatus = HTTPStatus.OK) -> Response:
        return Response(status, "text/html; charset=utf-8", text.encode())

    def _error(self, status: HTTPStatus, message: str, as_json: bool) -> Response:
        if as_json:
            return self._json({"error": message, "status": int(status)}, status)
        return self._html(pages.error_page(int(status), message, store=self.store_label), status)

    # -- connections -----------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request on the connection, then close it."""
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                return
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            fields = request_line.split()
            if len(fields) != 3 or not fields[2].startswith("HTTP/"):
                response = self._error(HTTPStatus.BAD_REQUEST, "malformed request", False)
                method = "GET"
            else:
                method = fields[0]
                response = await self.respond(method, fields[1])
            writer.write(_head(response))
            if method != "HEAD":
                writer.write(response.body)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()


def _head(response: Response) -> bytes:
    lines = [
        f"HTTP/1.1 {int(response.status)} {response.status.phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        "X-Content-Type-Options: nosniff",
        "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'",
        "Connection: close",
    ]
    if response.status is HTTPStatus.METHOD_NOT_ALLOWED:
        lines.append("Allow: GET, HEAD")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def start(dashboard: Dashboard, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` (port 0: any free port) and serve ``dashboard``."""
    return await asyncio.start_server(dashboard.handle, host, port, limit=MAX_HEADER_BYTES)
