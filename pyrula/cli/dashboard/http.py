"""The dashboard's HTTP/1.1 on asyncio streams: one request per connection, a body read by
its ``Content-Length``, HTTP Basic authentication, and server-sent event streams.

A request whose credentials are missing or wrong gets 401 and no data. A request that
changes something must be a POST with a JSON body (``Content-Type: application/json``)
and, when the browser sends an ``Origin``, come from the dashboard's own origin: a page
on another site cannot make a browser that holds the dashboard's credentials act.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
READ_TIMEOUT_S = 10.0
"""A client that sends no complete request within this is dropped."""
CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'"
)


class HttpError(Exception):
    """A request answered with ``status`` and ``message`` (a page, or JSON under /api)."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    path: str
    """The path below the URL prefix, ``/`` at least."""
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes = b""
    user: str | None = None

    def one(self, name: str) -> str | None:
        """The last value of query field ``name``; an empty one is None."""
        values = self.query.get(name)
        return values[-1] if values and values[-1] != "" else None


@dataclass
class Response:
    status: HTTPStatus
    content_type: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BasicAuth:
    """``user:pass`` credentials (Flower's ``--basic-auth``); several may be given."""

    pairs: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, specs: tuple[str, ...]) -> BasicAuth | None:
        pairs = []
        for spec in specs:
            for one in spec.split(","):
                user, sep, password = one.partition(":")
                if not sep or not user or not password:
                    raise ValueError(f"--basic-auth takes user:password, got {one!r}")
                pairs.append((user, password))
        return cls(tuple(pairs)) if pairs else None

    def user(self, header: str | None) -> str | None:
        """The user the ``Authorization`` header proves, or None."""
        if not header or not header.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, _, password = decoded.partition(":")
        found = None
        for known_user, known_password in self.pairs:  # compare every pair: no timing hint
            same = hmac.compare_digest(user.encode(), known_user.encode())
            same &= hmac.compare_digest(password.encode(), known_password.encode())
            if same:
                found = known_user
        return found


async def read_request(reader: asyncio.StreamReader, prefix: str) -> Request | Response | None:
    """The next request, an error response for a malformed one, or None when the client
    sent nothing usable in time."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    fields = lines[0].split()
    if len(fields) != 3 or not fields[2].startswith("HTTP/"):
        return text_response(HTTPStatus.BAD_REQUEST, "malformed request")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit() or int(length_text) > MAX_BODY_BYTES:
        return text_response(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "body too large")
    body = b""
    if int(length_text):
        try:
            body = await asyncio.wait_for(reader.readexactly(int(length_text)), READ_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError):
            return None
    parts = urlsplit(fields[1])
    path = parts.path
    if prefix:
        if path != prefix and not path.startswith(prefix + "/"):
            return text_response(HTTPStatus.NOT_FOUND, f"the dashboard is under {prefix}/")
        path = path[len(prefix) :]
    return Request(fields[0], path or "/", parse_qs(parts.query), headers, body)


def text_response(status: HTTPStatus, message: str) -> Response:
    return Response(status, "text/plain; charset=utf-8", (message + "\n").encode())


def unauthorized() -> Response:
    response = text_response(HTTPStatus.UNAUTHORIZED, "authentication required")
    response.headers["WWW-Authenticate"] = 'Basic realm="pyrula dashboard", charset="UTF-8"'
    return response


def same_origin(request: Request) -> bool:
    """Whether a state-changing request comes from the dashboard's own pages (or from a
    client that is not a browser: no ``Origin``)."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.headers.get("host", "")


def head_bytes(response: Response, *, length: bool = True) -> bytes:
    lines = [
        f"HTTP/1.1 {int(response.status)} {response.status.phrase}",
        f"Content-Type: {response.content_type}",
        "Cache-Control: no-store",
        "X-Content-Type-Options: nosniff",
        "Referrer-Policy: same-origin",
        f"Content-Security-Policy: {CSP}",
        "Connection: close",
    ]
    if length:
        lines.append(f"Content-Length: {len(response.body)}")
    lines.extend(f"{k}: {v}" for k, v in response.headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def sse_event(data: str, event: str | None = None) -> bytes:
    """One server-sent event; a multi-line ``data`` becomes several ``data:`` lines."""
    lines = [f"event: {event}"] if event else []
    lines.extend(f"data: {line}" for line in data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()
