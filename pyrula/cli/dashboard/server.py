"""The dashboard: pages and a JSON API over one Store object, on asyncio streams.

It reads and acts only through the public Store protocol (:mod:`.queries`,
:mod:`.actions`), so it works on every store kind. ``pyrula dashboard`` (and ``pyrula
flower``) serve it alone, running no worker; ``pyrula dev`` serves it on its worker's
event loop over the worker's own store object.

Pages (below the URL prefix): ``/`` runs, ``/runs/<id>``, ``/overview``, ``/workers``,
``/queues``, ``/schedules``, ``/owners``, ``/dead``. Each keeps itself current over
``/api/live?path=<page>`` (server-sent events carrying the page's live region). The JSON
API is documented in docs/dashboard.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from importlib import resources
from typing import Any
from urllib.parse import unquote

from pyrula.cli import render
from pyrula.cli.dashboard import actions, filters, fleet_pages, live, pages, queries, run_pages
from pyrula.cli.dashboard.http import (
    MAX_HEADER_BYTES,
    BasicAuth,
    HttpError,
    Request,
    Response,
    head_bytes,
    read_request,
    same_origin,
    unauthorized,
)
from pyrula.cli.dashboard.pages import Site
from pyrula.cli.schedules import schedule_dict
from pyrula.workflows.records import RunStatus
from pyrula.workflows.registry import Registry
from pyrula.workflows.stores.base import Store

log = logging.getLogger("pyrula.cli.dashboard")

BULK_KEEP = 50
"""Finished bulk jobs remembered for their progress page."""


@dataclass
class View:
    """A page: its title, its place in the navigation, its live region, its tools."""

    title: str
    nav: str
    live: str
    tools: str = ""


class Dashboard:
    """Answers requests from ``store``; ``registry`` knows the imported workflows (their
    parameter names, their flow control for submits)."""

    def __init__(
        self,
        store: Store,
        workflows: list[str] | None = None,
        store_label: str = "",
        *,
        registry: Registry | None = None,
        auth: BasicAuth | None = None,
        prefix: str = "",
    ) -> None:
        self.store = store
        self.registry = registry or Registry()
        known: dict[str, list[str] | None] = {name: None for name in workflows or ()}
        for definition in self.registry.all():
            known[definition.name] = actions.param_names(definition)
        self.site = Site(prefix=prefix.rstrip("/"), store=store_label, workflows=known)
        self.store_label = store_label
        self.auth = auth
        self.stopping = asyncio.Event()
        self.jobs: dict[str, actions.BulkProgress] = {}
        self._job_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.cache = queries.CostCache()
        self._prometheus: Any = None

    # -- connections -----------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request on the connection, then close it."""
        try:
            request = await read_request(reader, self.site.prefix)
            if request is None:
                return
            if isinstance(request, Response):
                writer.write(head_bytes(request) + request.body)
                await writer.drain()
                return
            if self.auth is not None:
                request.user = self.auth.user(request.headers.get("authorization"))
                if request.user is None:
                    response = unauthorized()
                    writer.write(head_bytes(response) + response.body)
                    await writer.drain()
                    return
            if request.method == "GET" and request.path == "/api/live":
                await self._live(request, reader, writer)
                return
            response = await self.respond(request)
            writer.write(head_bytes(response))
            if request.method != "HEAD":
                writer.write(response.body)
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    def close(self) -> None:
        """End the live streams (so the server's close does not wait on them)."""
        self.stopping.set()
        for task in list(self._tasks):
            task.cancel()

    # -- routing ---------------------------------------------------------------------
    async def respond(self, request: Request) -> Response:
        """The response to one request; errors become 4xx/5xx pages (JSON under /api)."""
        path = request.path
        as_json = path == "/api" or path.startswith("/api/")
        try:
            if request.method in ("GET", "HEAD"):
                if path == "/static/app.js":
                    return _static("app.js", "text/javascript; charset=utf-8")
                if path == "/metrics":  # Prometheus: the store's queues (pyrula.cli.metrics)
                    return await self._metrics()
                if as_json:
                    return self._json(await self._api_get(path.removeprefix("/api"), request))
                view = await self.view(path, request.query)
                return self._html(pages.shell(self.site, view.title, view.nav, view.live,
                                              tools=view.tools))  # fmt: skip
            if request.method == "POST" and as_json:
                if not same_origin(request):
                    raise HttpError(HTTPStatus.FORBIDDEN, "a request from another site")
                kind = request.headers.get("content-type", "").split(";")[0].strip()
                if kind != "application/json":
                    raise HttpError(
                        HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send the body as application/json"
                    )
                status, document = await self._api_post(path.removeprefix("/api"), request)
                return self._json(document, status)
            raise HttpError(HTTPStatus.METHOD_NOT_ALLOWED, "pages take GET; the API, GET or POST")
        except HttpError as exc:
            return self._error(exc.status, exc.message, as_json)
        except actions.ActionError as exc:
            return self._error(exc.status, exc.message, as_json)
        except queries.QueryError as exc:
            return self._error(HTTPStatus.BAD_REQUEST, str(exc), as_json)
        except Exception as exc:  # a store failure: show it, keep serving
            log.exception("dashboard request %s failed", path)
            message = f"{type(exc).__name__}: {exc}"
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, message, as_json)

    async def _metrics(self) -> Response:
        from pyrula.cli import metrics

        if not metrics.available():
            raise HttpError(HTTPStatus.NOT_FOUND, "metrics need pip install 'pyrula[metrics]'")
        if self._prometheus is None:
            self._prometheus = metrics.DashboardMetrics(self.store, self.registry)
        body, content_type = await self._prometheus.render()
        return Response(HTTPStatus.OK, content_type, body)

    async def view(self, path: str, query: dict[str, list[str]]) -> View:
        """The page at ``path``; 404 when there is none (an unknown run among them)."""
        now = await self.store.now()
        site = self.site
        if path in ("/", "/runs"):
            flat = filters.flat_query(query)
            listed = await self._runs(flat, now, wait_counts=False)
            tools = (
                run_pages.filter_form(site, flat)
                + run_pages.bulk_tools(site, flat)
                + run_pages.submit_form(site)
            )
            return View("Runs", "/", run_pages.runs_live(site, listed, flat), tools)
        if path.startswith("/runs/") and len(path) > len("/runs/"):
            run_id = unquote(path.removeprefix("/runs/"))
            detail, history = await self._run(run_id, now)
            return View(
                f"Run {run_id}",
                "/runs",
                run_pages.run_live(site, detail, history),
                run_pages.run_tools(site, detail["run"]),
            )
        lives: dict[str, tuple[str, Callable[[], Awaitable[str]]]] = {
            "/overview": (
                "Overview",
                lambda: self._with(
                    queries.overview(self.store, now, self.cache), fleet_pages.overview_live
                ),
            ),
            "/workers": (
                "Workers",
                lambda: self._with(
                    queries.workers(self.store, now, self.cache), fleet_pages.workers_live
                ),
            ),
            "/queues": (
                "Queues",
                lambda: self._with(
                    queries.queues(self.store, now, self.cache), fleet_pages.queues_live
                ),
            ),
            "/owners": (
                "Owners",
                lambda: self._with(queries.owners(self.store, self.cache), fleet_pages.owners_live),
            ),
            "/schedules": (
                "Schedules",
                lambda: self._with(self._schedules(), fleet_pages.schedules_live),
            ),
            "/dead": ("Dead letters", lambda: self._with(self._dead(now), fleet_pages.dead_live)),
        }
        if path in lives:
            title, make = lives[path]
            return View(title, path, await make())
        raise HttpError(HTTPStatus.NOT_FOUND, f"no page at {path}")

    async def _with(self, data: Awaitable[Any], draw: Callable[[Site, Any], str]) -> str:
        return draw(self.site, await data)

    # -- reads -----------------------------------------------------------------------
    async def _runs(
        self, flat: Mapping[str, str], now: float, *, wait_counts: bool = True
    ) -> queries.RunPage:
        page, size = filters.paging(flat)
        selected = filters.run_filter(flat, now)
        return await queries.runs_page(
            self.store, selected, page, size, self.cache, wait_counts=wait_counts
        )

    async def _run(self, run_id: str, now: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        record = await self.store.get_run(run_id)
        if record is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no run with id {run_id!r}")
        detail = await queries.run_detail(self.store, record, now)
        return detail, await actions.history(self.store, "run", run_id)

    async def _schedules(self, workflow: str | None = None) -> list[dict[str, Any]]:
        rows = []
        for record in await self.store.list_schedules(workflow=workflow):
            row = schedule_dict(record)
            last = await self.store.get_run(record.last_run_id) if record.last_run_id else None
            row["last_run"] = None if last is None else {
                "run_id": last.run_id, "status": last.status.value
            }  # fmt: skip
            rows.append(row)
        return rows

    async def _dead(self, now: float) -> list[dict[str, Any]]:
        dead = await self.store.list_runs(status=RunStatus.DEAD, limit=queries.SCAN_LIMIT)
        return [render.run_dict(r, now) for r in dead]

    async def _api_get(self, path: str, request: Request) -> Any:
        now = await self.store.now()
        if path in ("/runs", "/runs/"):
            listed = await self._runs(filters.flat_query(request.query), now)
            return {
                "runs": [render.run_dict(r, now) for r in listed.runs],
                "page": listed.page,
                "size": listed.size,
                "has_more": listed.has_more,
                "total": listed.total,
                "counts": listed.counts,
                "counts_capped": listed.capped,
            }
        if path.startswith("/runs/"):
            detail, history = await self._run(unquote(path.removeprefix("/runs/")), now)
            return {**detail, "actions": history}
        if path.startswith("/bulk/"):
            job = self.jobs.get(path.removeprefix("/bulk/"))
            if job is None:
                raise HttpError(HTTPStatus.NOT_FOUND, "no such bulk job")
            return job.as_dict()
        if path.startswith("/schedules/"):
            schedule_id = unquote(path.removeprefix("/schedules/"))
            found = [s for s in await self._schedules() if s["schedule_id"] == schedule_id]
            if not found:
                raise HttpError(HTTPStatus.NOT_FOUND, f"no schedule with id {schedule_id!r}")
            return {**found[0], "actions": await actions.history(self.store, "schedule",
                                                                 schedule_id)}  # fmt: skip
        simple: dict[str, Callable[[], Awaitable[Any]]] = {
            "/overview": lambda: queries.overview(self.store, now, self.cache),
            "/workers": lambda: queries.workers(self.store, now, self.cache),
            "/queues": lambda: queries.queues(self.store, now, self.cache),
            "/owners": lambda: queries.owners(self.store, self.cache),
            "/schedules": lambda: self._schedules(request.one("workflow")),
            "/dead": lambda: self._dead(now),
        }
        if path in simple:
            return {path.strip("/"): await simple[path]()}
        if path == "/workflows":
            return {"workflows": [{"name": n, "params": p} for n, p in
                                  sorted(self.site.workflows.items())]}  # fmt: skip
        raise HttpError(HTTPStatus.NOT_FOUND, f"no API at /api{path}")

    # -- actions ---------------------------------------------------------------------
    async def _api_post(self, path: str, request: Request) -> tuple[HTTPStatus, Any]:
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            raise HttpError(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        by = request.user or "anonymous"
        now = await self.store.now()
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts == ["runs"]:
            run, created = await actions.submit_run(
                self.store,
                self.registry,
                str(body.get("workflow") or ""),
                _json_text(body, "params"),
                owner=_str(body, "owner"),
                idempotency_key=_str(body, "idempotency_key"),
                by=by,
            )
            status = HTTPStatus.CREATED if created else HTTPStatus.OK
            return status, {"created": created, "run": render.run_dict(run, now)}
        if len(parts) == 3 and parts[0] == "runs" and parts[2] == "signal":
            run = await actions.signal_run(
                self.store, parts[1], str(body.get("name") or ""), _json_text(body, "payload"), by
            )
            return HTTPStatus.OK, {"run": render.run_dict(run, now)}
        if len(parts) == 3 and parts[0] == "runs":
            run = await actions.run_action(self.store, parts[1], parts[2], by)
            return HTTPStatus.OK, {"run": render.run_dict(run, now)}
        if len(parts) == 3 and parts[0] == "schedules":
            record, started = await actions.schedule_action(
                self.store, self.registry, parts[1], parts[2], by
            )
            return HTTPStatus.OK, {
                "schedule": None if record is None else schedule_dict(record),
                "run": None if started is None else render.run_dict(started, now),
            }
        if len(parts) == 3 and parts[0] == "queues" and parts[2] == "purge":
            purged = await actions.purge_queue(self.store, parts[1], by)
            return HTTPStatus.OK, {"queue": parts[1], "purged": purged}
        if parts == ["bulk"]:
            return HTTPStatus.ACCEPTED, await self._bulk(body, by, now)
        raise HttpError(HTTPStatus.NOT_FOUND, f"no API at POST /api{path}")

    async def _bulk(self, body: Mapping[str, Any], by: str, now: float) -> dict[str, Any]:
        action = str(body.get("action") or "")
        if action not in actions.BULK_ACTIONS:
            raise HttpError(HTTPStatus.BAD_REQUEST, "action must be retry or cancel")
        given = body.get("filter") or {}
        if not isinstance(given, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "filter must be an object")
        selected = filters.run_filter({k: str(v) for k, v in given.items() if v is not None}, now)
        runs = await queries.matching_runs(self.store, selected, queries.SCAN_LIMIT)
        job_id = str(next(self._job_ids))
        progress = actions.BulkProgress(action, selected=len(runs))
        self.jobs[job_id] = progress
        for old in list(self.jobs)[:-BULK_KEEP]:
            if self.jobs[old].finished:
                del self.jobs[old]
        task = asyncio.create_task(actions.bulk_action(self.store, runs, action, by, progress))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return {"job": job_id, "progress": self.site.href(f"/api/bulk/{job_id}"),
                **progress.as_dict()}  # fmt: skip

    # -- live ------------------------------------------------------------------------
    async def _live(
        self, request: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Stream the live region of page ``?path=``; ended by :meth:`close` too."""

        async def region(path: str, query: dict[str, list[str]]) -> str:
            return (await self.view(path, query)).live

        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await live.stream(region, self.site.prefix, request, reader, writer, self.stopping)
        except asyncio.CancelledError:
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)

    # -- bodies ----------------------------------------------------------------------
    def _json(self, document: Any, status: HTTPStatus = HTTPStatus.OK) -> Response:
        body = (render.to_json(document) + "\n").encode()
        return Response(status, "application/json; charset=utf-8", body)

    def _html(self, text: str, status: HTTPStatus = HTTPStatus.OK) -> Response:
        return Response(status, "text/html; charset=utf-8", text.encode())

    def _error(self, status: HTTPStatus, message: str, as_json: bool) -> Response:
        if as_json:
            return self._json({"error": message, "status": int(status)}, status)
        response = self._html(pages.error_page(self.site, int(status), message), status)
        if status is HTTPStatus.METHOD_NOT_ALLOWED:
            response.headers["Allow"] = "GET, HEAD"
        return response


def _str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    return None if value is None else str(value)


def _json_text(body: Mapping[str, Any], name: str) -> str:
    """A JSON field given as text (``<name>_text``, as the pages send it, parsed by the
    action) or as a value (``<name>``, as scripts send it)."""
    if f"{name}_text" in body:
        return str(body[f"{name}_text"])
    if name in body:
        return json.dumps(body[name], allow_nan=False)
    return ""


def _static(name: str, content_type: str) -> Response:
    data = resources.files("pyrula.cli.dashboard").joinpath("static", name).read_bytes()
    return Response(HTTPStatus.OK, content_type, data)


async def start(dashboard: Dashboard, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` (port 0: any free port) and serve ``dashboard``."""
    return await asyncio.start_server(dashboard.handle, host, port, limit=MAX_HEADER_BYTES)


async def stop(dashboard: Dashboard, server: asyncio.Server) -> None:
    dashboard.close()
    server.close()
    await server.wait_closed()
