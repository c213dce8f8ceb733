"""What every HTTP request passes before a route sees it, and the answers kept for retries.

- `EdgeGuard` (ASGI middleware): the Host header must name the bound address (or server.allowed_hosts; on loopback
  also localhost), so a web page whose DNS name was rebound to 127.0.0.1 is refused; a browser request from
  another site (an Origin naming another host, or Sec-Fetch-Site cross-site / same-site) is refused; at most
  server.max_concurrent_requests requests are in flight (/healthz aside), one more is a 503; the bodies they hold
  together are bounded by server.max_inflight_body_bytes (read_bytes reserves, one more is a 503).
- `check_content_type`: a route takes only its own body type (the wire's; JSON or protobuf on the Tinker routes),
  so a browser's cross-site form or text/plain POST, which needs no CORS preflight, never reaches an op.
- `ResultCache`: the answers of requests that carried an id, kept by count, bytes and age, so a retry of a
  request already applied gets its answer instead of running it again.
- `uvicorn_config`: the HTTP server itself, before any request exists: a connection that sends no whole request
  head within server.http_head_timeout_s is closed, one past server.max_connections is answered 503 and closed, a
  head over server.max_head_bytes is a 413 and closed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import Request

from arctic_rl.config import LOOPBACK, ArcticRLClientConfig
from arctic_rl.errors import (
    ArcticRLError,
    ForbiddenError,
    MediaTypeError,
    ProtocolError,
    ServerBusyError,
    TooLargeError,
)

WILDCARD = ("0.0.0.0", "::", "")
UNCAPPED = ("/healthz", "/api/v1/healthz")  # liveness answers even when the server is full


def allowed_hosts(cfg: ArcticRLClientConfig) -> frozenset[str] | None:
    """Host names a request may name; None: any (bound to every interface with no server.allowed_hosts)."""
    extra = {h.lower().strip("[]") for h in cfg.server.allowed_hosts}
    if cfg.host in WILDCARD:
        return frozenset(extra) if extra else None
    names = {cfg.host.lower().strip("[]")} | extra
    if _is_loopback(cfg.host):
        names |= set(LOOPBACK)
    return frozenset(names)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _hostname(value: str) -> str | None:
    """The host name of a Host header ('h', 'h:port', '[v6]:port') or an Origin ('scheme://h:port')."""
    try:
        parts = urlsplit(value if "://" in value else f"//{value}")
        return parts.hostname  # lower-cased, brackets and port stripped
    except ValueError:
        return None


def edge_refusal(headers: Headers, hosts: frozenset[str] | None) -> str | None:
    """Why a request is refused before any route runs, or None."""
    host = headers.get("host", "")
    if hosts is not None and _hostname(host) not in hosts:
        return (
            f"Host {host[:100]!r} is not an address this server is bound to ({sorted(hosts)}): add it to "
            "server.allowed_hosts if it is yours (refused: a web page's DNS name rebound to this address)"
        )
    origin = headers.get("origin")
    if origin is not None and (hosts is None or _hostname(origin) not in hosts):
        return (
            f"Origin {origin[:100]!r}: requests from web pages of other sites are refused (list the host in "
            "server.allowed_hosts to serve a page of your own)"
        )
    site = headers.get("sec-fetch-site")
    if site in ("cross-site", "same-site"):
        return f"Sec-Fetch-Site {site!r}: requests from web pages of other sites are refused"
    return None


def error_response_body(e: ArcticRLError) -> bytes:
    # both shapes: the /v1 client reads "type"/"message", the Tinker SDK "detail"
    return json.dumps({"type": type(e).__name__, "message": str(e), "detail": str(e)}).encode()


BODY_TICKET = "arctic_rl.body_ticket"  # the scope key of a request's BodyTicket


class BodyBudget:
    """Bytes of request bodies held at once by all requests in flight (server.max_inflight_body_bytes). Used from
    the event loop only."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0


class BodyTicket:
    """One request's share of the BodyBudget: reserved by read_bytes (its content-length, else what has arrived),
    given back by EdgeGuard when the request ends."""

    def __init__(self, budget: BodyBudget):
        self.budget, self.held = budget, 0

    def reserve(self, total: int) -> None:
        more = total - self.held
        if more <= 0:
            return
        b = self.budget
        if b.held + more > b.limit:
            raise ServerBusyError(
                f"requests in flight hold {b.held} bytes of bodies; this one's {total} bytes would exceed the "
                f"server's limit of {b.limit} (server.max_inflight_body_bytes): nothing ran, send it again later"
            )
        b.held += more
        self.held += more

    def release(self) -> None:
        self.budget.held -= self.held
        self.held = 0


class EdgeGuard:
    """ASGI middleware: the Host / Origin checks, the concurrency cap and the body budget (module docstring)."""

    def __init__(self, app, hosts: frozenset[str] | None, max_concurrent: int, max_body_in_flight: int | None = None):
        self.app, self.hosts, self.max_concurrent = app, hosts, max_concurrent
        self.in_flight = 0
        self.bodies = BodyBudget(max_body_in_flight) if max_body_in_flight is not None else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        why = edge_refusal(Headers(scope=scope), self.hosts)
        if why is not None:
            return await _send_error(send, ForbiddenError(why))
        if scope["path"] in UNCAPPED:
            return await self.app(scope, receive, send)
        if self.in_flight >= self.max_concurrent:
            busy = ServerBusyError(
                f"{self.in_flight} requests in flight, the server's limit (server.max_concurrent_requests="
                f"{self.max_concurrent}): nothing ran, send it again later"
            )
            return await _send_error(send, busy, [(b"retry-after", b"1")])
        self.in_flight += 1
        ticket = None
        if self.bodies is not None:
            ticket = scope[BODY_TICKET] = BodyTicket(self.bodies)
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if ticket is not None:
                ticket.release()


async def _send_error(send, e: ArcticRLError, extra: list | None = None) -> None:
    body = error_response_body(e)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": e.http_status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


async def read_bytes(request: Request, max_body: int, key: str = "server.max_body_bytes") -> bytearray:
    """The request's body, refused (TooLargeError) once it exceeds `max_body` bytes (the config key `key`), whatever
    its header says. Not copied into bytes: a copy of a large body on the event loop stalls every other request."""
    declared = request.headers.get("content-length")
    if declared is not None and not declared.isdigit():
        raise ProtocolError(f"bad content-length header {declared[:40]!r}")
    if declared is not None and int(declared) > max_body:
        raise TooLargeError(f"request body of {declared} bytes exceeds the server's limit of {max_body} ({key})")
    ticket: BodyTicket | None = request.scope.get(BODY_TICKET)  # the bodies all requests hold (EdgeGuard)
    if ticket is not None and declared is not None:
        ticket.reserve(int(declared))
    body = bytearray()
    async for chunk in request.stream():  # the header may lie (or be absent): count what arrives
        body += chunk
        if len(body) > max_body:
            raise TooLargeError(f"request body exceeds the server's limit of {max_body} bytes ({key})")
        if ticket is not None:
            ticket.reserve(len(body))
    return body


def json_body_limit(cfg: ArcticRLClientConfig) -> int:
    """The most bytes of a JSON body (Tinker's JSON routes, OpenAI's): parsing JSON holds the GIL throughout."""
    return min(cfg.server.max_json_bytes, cfg.server.max_body_bytes)


def check_content_type(headers: Headers, accepted: tuple[str, ...]) -> None:
    """Refuses (415) a body whose content type is not one of `accepted` (parameters after ';' ignored)."""
    got = headers.get("content-type", "")
    if got.split(";")[0].strip().lower() not in accepted:
        raise MediaTypeError(
            f"content-type {got[:80]!r} is not taken here: send {' or '.join(accepted)} (a browser's "
            "cross-site form or text/plain POST is refused)"
        )


# -- retries -----------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    body: bytes
    media_type: str


@dataclass
class Entry:
    digest: str  # of the op and body: an id reused for another request is refused
    started: float = field(default_factory=lambda: time.monotonic())
    # Set once the op is done (whoever waits, or nobody: the first request may have timed out).
    answer: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def done(self) -> bool:
        return self.answer.done() and not self.answer.cancelled()

    @property
    def size(self) -> int:
        return len(self.answer.result().body) if self.done else 0


class ResultCache:
    """Request id -> Entry. Finished answers are dropped oldest first past `max_entries` or `max_bytes` and after
    `max_age_s`; an entry whose op still runs is never dropped (a retry must wait for it, not run it again).
    Used from the event loop only."""

    def __init__(self, max_entries: int, max_bytes: int, max_age_s: float):
        self.max_entries, self.max_bytes, self.max_age_s = max_entries, max_bytes, max_age_s
        self.entries: OrderedDict[str, Entry] = OrderedDict()

    def get(self, request_id: str) -> Entry | None:
        self.prune()
        return self.entries.get(request_id)

    def start(self, request_id: str, digest: str) -> Entry:
        entry = self.entries[request_id] = Entry(digest)
        return entry

    def forget(self, request_id: str) -> None:
        self.entries.pop(request_id, None)

    def prune(self) -> None:
        now = time.monotonic()
        total = sum(e.size for e in self.entries.values())
        for rid, e in list(self.entries.items()):
            over = len(self.entries) > self.max_entries or total > self.max_bytes
            if e.done and (over or now - e.started > self.max_age_s):
                total -= e.size
                del self.entries[rid]


# -- connections -------------------------------------------------------------------------------------------------


def _refuse_connection(transport, e: ArcticRLError) -> None:
    """A raw HTTP answer of `e`'s status and body, then the connection closed (no request may have been read)."""
    body = error_response_body(e)
    head = (
        f"HTTP/1.1 {e.http_status} {HTTPStatus(e.http_status).phrase}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n"
        + ("retry-after: 1\r\n" if e.http_status == 503 else "")
        + "\r\n"
    )
    transport.write(head.encode() + body)
    transport.close()


def guarded_protocol(head_timeout_s: float, max_connections: int, max_head_bytes: int) -> type[asyncio.Protocol]:
    """uvicorn's own HTTP protocol (httptools where installed, else h11), with what uvicorn has no setting for: a
    timeout on the request head (uvicorn arms its keep-alive timer only after an answer, so a connection that never
    sends a head stays open for good), a limit on open connections (uvicorn's limit_concurrency answers 503 to the
    requests of an over-full server but accepts and keeps every connection), and one on the head's size (httptools
    has none)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class GuardedHTTPProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        head_timer: asyncio.TimerHandle | None = None
        head_bytes = 0

        def waiting_for_head(self) -> bool:  # no request in progress (none yet, or the last one answered)
            return self.cycle is None or self.cycle.response_complete

        def arm(self) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            self.head_bytes = 0
            self.head_timer = self.loop.call_later(head_timeout_s, self.head_expired)

        def head_expired(self) -> None:
            self.head_timer = None
            if self.waiting_for_head() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                busy = ServerBusyError(
                    f"{len(self.connections) - 1} connections are open, the server's limit (server.max_connections="
                    f"{max_connections}): this one is closed, connect again later"
                )
                return _refuse_connection(transport, busy)
            self.arm()

        def data_received(self, data: bytes) -> None:
            waiting = self.waiting_for_head()
            super().data_received(data)
            if waiting and self.waiting_for_head() and not self.transport.is_closing():  # still no whole head
                self.head_bytes += len(data)
                if self.head_bytes > max_head_bytes:
                    big = TooLargeError(
                        f"request head of more than {max_head_bytes} bytes (server.max_head_bytes): connection closed"
                    )
                    _refuse_connection(self.transport, big)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
            super().connection_lost(exc)

    return GuardedHTTPProtocol


def uvicorn_config(app, cfg: ArcticRLClientConfig, **kwargs: Any):
    """uvicorn's Config for `app` on cfg's host and port, with the server's connection limits (module docstring)."""
    import uvicorn

    sc = cfg.server
    return uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        http=guarded_protocol(sc.http_head_timeout_s, sc.max_connections, sc.max_head_bytes),
        h11_max_incomplete_event_size=sc.max_head_bytes,  # h11's own head limit, where h11 is the parser
        **kwargs,
    )
