"""The ASGI application: ``/v1/realtime`` directly on ASGI, every HTTP route on Quart-trio.

Authentication and the Origin policy run before the WebSocket upgrade, so a
refused client gets a plain HTTP 401/403 and never a session.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path, PurePath
from typing import Any, Final, cast
from urllib.parse import parse_qsl, urlsplit

import attrs
import trio
from quart import Response, jsonify, request, send_file
from quart_trio import QuartTrio

from realtime import __version__, cpu_blas, endpoints
from realtime.endpoints import NATIVE_PATH
from realtime.engine.facade import Engine
from realtime.http.guard import ConnectionTable, absorb, install
from realtime.limits import Limits
from realtime.live.connection import LiveConnection
from realtime.models.prompt_cache import CachesPrompts
from realtime.native import wire as native_wire
from realtime.native.connection import NativeConnection
from realtime.observe import HTTPRefusalReason, Observer, Observers, RefusalReason
from realtime.openai import events as openai_events
from realtime.openai.connection import OpenAIConnection
from realtime.session.close_codes import CLOSE_GOING_AWAY, CLOSE_POLICY
from realtime.session.lifetime import Transport, TransportClosed, busy_message
from realtime.session.link import (
    CLOSE_REPLACED,
    LINK_MESSAGE_CHARS,
    Attachment,
    ErrorText,
    Link,
    Offer,
    Resumed,
)
from realtime.session.resume import (
    RESUME_FIRST_MESSAGE_SECONDS,
    FailedResumes,
    Journal,
    Registry,
)
from realtime.telemetry.logs import SessionLog
from realtime.telemetry.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from realtime.telemetry.metrics import PrometheusObserver
from realtime.telemetry.recording import Recording
from realtime.tenants import Tenant, Tenants

log = logging.getLogger(__name__)

ASGIScope = dict[str, Any]
ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]

REALTIME_PATH: Final = NATIVE_PATH
SUBPROTOCOL: Final = "realtime"
KEY_SUBPROTOCOL_PREFIX: Final = "realtime-key."
OPENAI_PATH: Final = endpoints.OPENAI_PATH
OPENAI_KEY_SUBPROTOCOL_PREFIX: Final = "openai-insecure-api-key."
MAX_KEY_SUBPROTOCOLS: Final = 4
"""Key subprotocols of one upgrade that are tried (a browser offers one)."""
LIVE_PATH: Final = endpoints.LIVE_PATH
LIVE_UNSERVED: Final = (
    "this server serves the Live API over its primary WebSocket only "
    f"(connect to {LIVE_PATH}); WebRTC (POST {LIVE_PATH}), SIP, sideband attach, forks and "
    "recording downloads are not served (docs/openai-compatibility.md)"
)
"""Why every other Live API address answers 501."""
PUBLIC_PATHS: Final = ("/", "/favicon.ico")
PUBLIC_PREFIXES: Final = ("/static/",)
STATIC_DIR: Final = Path(__file__).parent.parent / "static"


def _default_observer(state: ServerState) -> Observer:
    return Observers((state.metrics, SessionLog()))


@attrs.define(slots=True)
class ServerState:
    engine: Engine
    limits: Limits = attrs.field(factory=Limits)
    api_key: str | None = None
    """``--api-key``: the one-tenant case of ``tenants`` (named ``default``)."""
    tenants: Tenants | None = None
    """The keys in force (``--api-keys-file``, or the one ``api_key``); None: no key
    is asked for, every client is the same (unnamed) tenant."""
    allowed_origins: tuple[str, ...] = ()
    bind_hosts: tuple[str, ...] = ()
    """The addresses the server listens on (``--host``); empty: the address each
    connection arrived on is used instead (an external ASGI server)."""
    allowed_hosts: tuple[str, ...] = ()
    """Host header names accepted besides loopback ones (``--allowed-host``; ``*``: any)."""
    shutdown: trio.Event = attrs.field(factory=trio.Event)
    """Set when open connections must close now (1001)."""
    recording: Recording | None = None
    """``--record DIR``: every session's call recording (None: nothing is recorded)."""
    draining: trio.Event = attrs.field(factory=trio.Event)
    """Set on SIGTERM before ``shutdown``: /ready turns 503 and new upgrades get 503,
    while the active conversation may finish."""
    connections: int = 0
    transports: set[ASGITransport] = attrs.field(factory=set)
    """The open WebSockets, so a bounded shutdown can abort those that do not close."""
    idle: trio.Event = attrs.field(factory=trio.Event)
    """Set whenever no connection is open, for graceful shutdown."""
    metrics: PrometheusObserver = attrs.field(factory=PrometheusObserver)
    """The ``/metrics`` registry; it is also one of ``observer``'s members."""
    observer: Observer = attrs.field(default=attrs.Factory(_default_observer, takes_self=True))
    """What connections and the engine report to: metrics and the session log.
    The engine takes the same object at construction (``Engine(..., observer=)``)."""
    replica_id: str | None = None
    """``--replica-id``: this replica's name, carried in ``session.resumable`` so a
    balancer can route a resume back here (docs/resume.md)."""
    resumes: Registry[Link] = attrs.field(factory=Registry)
    """The resumable sessions, by their tokens' SHA-256."""
    failed_resumes: FailedResumes = attrs.field(factory=FailedResumes)
    """Failed resumes per client address (a flood gets HTTP 429)."""

    tcp: ConnectionTable = attrs.field(init=False)
    """Every open TCP connection (HTTP too), for the connection bound, the write
    bound and the shutdown bound (realtime.http.guard)."""

    def detached(self) -> int:
        """Resumable sessions waiting for a resume now (each holds its slot)."""
        return sum(link.detached for link in self.resumes.holders())

    def resumable_held(self) -> bool:
        """Whether a resumable session holds a slot now (detached or attached): a
        balancer may not count it (a resume past its connection limit), so a full
        replica refuses new clients before the upgrade (docs/resume.md)."""
        return any(not link.ended for link in self.resumes.holders())

    def tails(self) -> int:
        """Ended sessions whose unacknowledged last events wait for a resume (no slot)."""
        return sum(link.ended for link in self.resumes.holders(trio.current_time()))

    def abort_connections(self) -> int:
        """Reset every open WebSocket's TCP connection; how many were found."""
        return sum(transport.abort() for transport in list(self.transports))

    def __attrs_post_init__(self) -> None:
        if self.tenants is None and self.api_key is not None:
            self.tenants = Tenants.single(self.api_key)
        self.tcp = ConnectionTable.for_process(
            send_timeout=self.limits.send_timeout,
            shutdown_timeout=self.limits.shutdown_timeout,
            bound=self.limits.max_connections,
            observer=self.observer,
        )
        # Under an external server (the Hypercorn CLI) its SIGTERM reaches the app only
        # this way; `realtime serve` sets shutdown itself, earlier (after the drain).
        self.tcp.stopping = self.shutdown.set
        self.idle.set()
        self.metrics.watch(self.engine, draining=self.draining.is_set)
        # The engine thread reports model steps to the same observer as the connections.
        self.engine.observe(self.observer)


class ASGITransport:
    """An accepted ASGI WebSocket as the lifecycle's
    :class:`~realtime.session.pipeline.Transport`."""

    def __init__(
        self,
        receive: ASGIReceive,
        send: ASGISend,
        scope: ASGIScope | None = None,
        table: ConnectionTable | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._scope = scope or {}
        self._table = table
        """The guard's open TCP connections, which hold this WebSocket's."""

    async def receive(self) -> str | bytes | None:
        message = await self._receive()
        if message["type"] == "websocket.receive":
            text: str | None = message.get("text")
            return text if text is not None else message.get("bytes")
        code = message.get("code")
        # 1006: the connection dropped without a close frame (Hypercorn's code for it).
        raise TransportClosed(code if isinstance(code, int) and code != 1006 else None)

    async def send(self, text: str) -> None:
        await self._send({"type": "websocket.send", "text": text})

    async def close(self, code: int, reason: str) -> None:
        await self._send({"type": "websocket.close", "code": code, "reason": reason})

    def abort(self) -> bool:
        """Reset the TCP connection under this WebSocket (for a client the server has
        given up on: a write blocked on it ends at once); whether it was found."""
        if self._table is None:
            return False
        return self._table.abort(self._scope.get("server"), self._scope.get("client"))


def _error(status: int, code: str, message: str) -> Response:
    response = jsonify({"error": {"code": code, "message": message}})
    response.status_code = status
    return response


def _bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def key_holder(
    state: ServerState,
    authorization: str | None,
    subprotocols: Sequence[str] = (),
    prefix: str = KEY_SUBPROTOCOL_PREFIX,
) -> Tenant | None:
    """Whose key a request carries (its Bearer header, or a WebSocket subprotocol
    ``PREFIX<key>``), or None; every key is compared in constant time
    (:meth:`realtime.tenants.Tenants.find`)."""
    if state.tenants is None:
        return None
    bearer = _bearer_token(authorization)
    offered = [proto[len(prefix) :] for proto in subprotocols if proto.startswith(prefix)]
    del offered[MAX_KEY_SUBPROTOCOLS:]  # each costs a digest per tenant
    return state.tenants.find(([bearer] if bearer is not None else []) + offered)


DEFAULT_PORTS: Final = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def is_loopback(name: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (a host name or a bind address)."""
    name = name.strip().strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header as (lower-case name, port or None); None when malformed."""
    try:
        parts = urlsplit("//" + value.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.username is not None:
        return None
    return parts.hostname.rstrip("."), port


def host_allowed(host: str | None, local: Sequence[str], allowed: Sequence[str]) -> bool:
    """Whether a request's ``Host`` header may reach this server.

    A server listening on loopback only (``local``) accepts loopback names only, so
    a web page whose name resolves to 127.0.0.1 (DNS rebinding) cannot reach it;
    ``allowed`` adds names (``name`` or ``name:port``; ``*`` accepts any). A server
    listening elsewhere accepts any name unless ``allowed`` lists some. No Host
    header at all, or an empty one (HTTP/1.0: HAProxy's ``option httpchk``; servers
    hand it on as ``''``), passes: a browser always sends one, so such a request is
    no DNS-rebinding risk.
    """
    if not host:
        return True  # absent (HTTP/1.0, a health checker): no browser sends that
    parsed = split_host(host)
    if parsed is None:
        return False
    name, port = parsed
    if "*" in allowed:
        return True
    for entry in allowed:
        wanted = split_host(entry)
        if wanted is not None and wanted[0] == name and wanted[1] in (None, port):
            return True
    if is_loopback(name):
        return True
    loopback_only = bool(local) and all(is_loopback(address) for address in local)
    return not loopback_only and not allowed


def origin_allowed(
    origin: str | None, host: str | None, allowed: Sequence[str], scheme: str = "http"
) -> bool:
    """No Origin (a non-browser client) passes; so does the server's own origin: the
    same scheme (``http`` for ws, ``https`` for wss), host name and port as the
    request (``scheme``, ``Host``). Other origins must be listed (``*``: any)."""
    if origin is None:
        return True
    if "*" in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    parsed = split_host(host or "")
    if parsed is None:
        return False
    try:
        parts = urlsplit(origin)
        origin_port = parts.port
    except ValueError:
        return False
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    if parts.scheme.lower() != scheme or parts.hostname is None:
        return False
    default = DEFAULT_PORTS[scheme]
    return (parts.hostname.rstrip("."), origin_port or default) == (
        parsed[0],
        parsed[1] or default,
    )


def host_refusal(
    state: ServerState, host: str | None, server: Sequence[Any] | None
) -> tuple[int, str, str] | None:
    """Why a request's ``Host`` header is refused (HTTP status, code, message), or None."""
    local = state.bind_hosts or ((str(server[0]),) if server else ())
    if host_allowed(host, local, state.allowed_hosts):
        return None
    return (
        403,
        "forbidden_host",
        f"host {host!r} is not a name of this server (it listens on loopback and "
        "answers loopback names only); start it with --allowed-host to allow it",
    )


def request_scheme(scope: ASGIScope, headers: Mapping[str, str]) -> str:
    """The scheme the client used: the proxy's ``X-Forwarded-Proto``, else the scope's."""
    forwarded = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    if forwarded in ("http", "https"):
        return forwarded
    return {"ws": "http", "wss": "https"}.get(scope.get("scheme", "http"), "http")


WEBSOCKET_HTTP_VERSIONS: Final = ("1.1", "1.0")
"""The HTTP versions a WebSocket is accepted over (ASGI's ``http_version``)."""


def upgrade_refusal(
    state: ServerState,
    headers: Mapping[str, str],
    subprotocols: Sequence[str],
    *,
    key_prefix: str = KEY_SUBPROTOCOL_PREFIX,
    scheme: str = "http",
    server: Sequence[Any] | None = None,
    http_version: str = "1.1",
    tenant: Tenant | None = None,
    resuming: bool = False,
) -> tuple[int, str, str] | None:
    """Why a WebSocket upgrade is refused (HTTP status, code, message), or None.
    ``key_prefix``: the subprotocol a browser carries the API key in; ``tenant``: whose
    key the request carries (:func:`key_holder`), None for none; ``resuming``: a
    resume (``?resume=1``), let through while draining; ``scheme``
    (``http``/``https``), ``server`` (the local address) and ``http_version``: from
    the ASGI scope.

    WebSockets are served over HTTP/1.1 only: over HTTP/2 (RFC 8441) Hypercorn's
    stream buffer takes every write into memory whatever the peer's flow-control
    window, so neither the stalled-reader clock nor the write bound could drop a
    client that reads nothing. Browsers and every client here use HTTP/1.1."""
    if http_version not in WEBSOCKET_HTTP_VERSIONS:
        return (
            505,
            "http_version_not_supported",
            f"WebSockets are served over HTTP/1.1 only, not HTTP/{http_version}; "
            "connect with HTTP/1.1",
        )
    refused = host_refusal(state, headers.get("host"), server)
    if refused is not None:
        return refused
    if state.tenants is not None and tenant is None:
        return (
            401,
            "unauthorized",
            "missing or wrong API key: send 'Authorization: Bearer <key>' or the "
            f"subprotocol '{key_prefix}<key>'",
        )
    origin = headers.get("origin")
    if not origin_allowed(origin, headers.get("host"), state.allowed_origins, scheme):
        return (
            403,
            "forbidden_origin",
            f"origin {origin!r} may not open /v1/realtime (it is not this server's own "
            "scheme, host and port); start the server with --allowed-origin to allow it",
        )
    # A resume during the drain is the open conversation going on: let it through.
    if (state.draining.is_set() and not resuming) or state.shutdown.is_set():
        # 503 before the upgrade: a balancer retries it on another replica.
        return (
            503,
            "draining",
            "this server is shutting down and takes no new conversations; retry "
            "(a load balancer sends you to another replica)",
        )
    return None


class RealtimeApp:
    """The ASGI entry point: ``/v1/realtime`` is served here, directly on ASGI;
    every other request, and the lifespan, goes to the Quart-trio app.

    Why not a Quart websocket route: Quart relays each message through an extra
    task, a memory channel and a signal dispatch, in both directions; on the
    per-frame path (what that cost is in docs/performance.md).
    """

    def __init__(self, state: ServerState, http: QuartTrio) -> None:
        self.state = state
        self.http = http

    @property
    def connection_table(self) -> ConnectionTable:
        """What :class:`realtime.http.guard.GuardedTCPServer` looks for on the app it serves."""
        return self.state.tcp

    async def __call__(self, scope: ASGIScope, receive: ASGIReceive, send: ASGISend) -> None:
        """Serve one request or WebSocket under the app's guard: an exception (a bug of
        ours or of a library) is logged as one line and counted; Hypercorn then ends
        that connection (500, or close 1011), and nothing else is touched."""
        try:
            path = scope.get("path", "")
            if scope["type"] == "websocket" and path == REALTIME_PATH:
                await self._realtime(scope, receive, send, NativeConnection)
            elif scope["type"] == "websocket" and path == OPENAI_PATH:
                await self._realtime(scope, receive, send, OpenAIConnection)
            elif scope["type"] == "websocket" and path == LIVE_PATH:
                await self._realtime(scope, receive, send, LiveConnection)
            elif scope["type"] == "websocket" and path.startswith(LIVE_PATH + "/"):
                if (await receive())["type"] == "websocket.connect":
                    await _refuse_upgrade(scope, send, 501, "not_implemented", LIVE_UNSERVED)
            else:
                await self.http(scope, receive, _finish_shielded(send))  # type: ignore[arg-type]
        except BaseException as error:
            absorb(error, lambda exc: self._report(scope, exc))

    def _report(self, scope: ASGIScope, exc: Exception) -> None:
        client = scope.get("client") or ("?", 0)
        where = f"{scope.get('type')} {client[0]}:{client[1]}"
        self.state.observer.connection_error("app")
        self.state.tcp.note("app-error", "%s ended by %s: %s", where, type(exc).__name__, exc)
        log.debug("%s: the exception", where, exc_info=exc)

    async def _realtime(
        self,
        scope: ASGIScope,
        receive: ASGIReceive,
        send: ASGISend,
        dialect: type[NativeConnection | OpenAIConnection | LiveConnection],
    ) -> None:
        """One WebSocket conversation in ``dialect`` (native, OpenAI Realtime GA or Live),
        all on the same engine."""
        openai = dialect is not NativeConnection
        if (await receive())["type"] != "websocket.connect":
            return
        headers = {
            key.decode("latin-1").lower(): value.decode("latin-1")
            for key, value in scope.get("headers", [])
        }
        offered = list(scope.get("subprotocols", []))
        prefix = OPENAI_KEY_SUBPROTOCOL_PREFIX if openai else KEY_SUBPROTOCOL_PREFIX
        tenant = key_holder(self.state, headers.get("authorization"), offered, prefix)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        wants_resume = query.get("resume") in ("1", "true")
        refusal = upgrade_refusal(
            self.state,
            headers,
            offered,
            key_prefix=prefix,
            scheme=request_scheme(scope, headers),
            server=scope.get("server"),
            http_version=str(scope.get("http_version", "1.1")),
            tenant=tenant,
            resuming=wants_resume and dialect is not LiveConnection,
        )
        if refusal is not None:
            self.state.observer.connection_refused(_REFUSAL_REASONS.get(refusal[1], "unauthorized"))
            await _refuse_upgrade(scope, send, *refusal)
            return
        state = self.state
        resumable = query.get("resumable") in ("1", "true")
        if dialect is LiveConnection and ("resume" in query or "resumable" in query):
            await _refuse_upgrade(scope, send, 400, "invalid_request", LIVE_NO_RESUME)
            return
        if wants_resume:
            await self._resume(scope, receive, send, dialect, tenant)
            return
        if (
            state.replica_id is not None
            and state.engine.refusal() == "busy"
            and state.resumable_held()
        ):
            # A replica behind a balancer (--replica-id): a resumable session may hold
            # its slot unseen by the balancer's per-server connection count (detached:
            # no TCP connection; resumed past the balancer's limit: uncounted), so a new
            # client is refused before the upgrade and the balancer retries it on
            # another replica (docs/resume.md). A server on its own keeps the seed's
            # answer: server_busy and close 1013 after the upgrade.
            state.observer.connection_refused("busy")
            why = " (a conversation waits for a resume)" if state.detached() else ""
            message = busy_message(state.engine, "busy") + why
            await _refuse_upgrade(
                scope, send, 503, "server_busy", message, headers=[(b"retry-after", b"1")]
            )
            return
        seat = state.tenants.seat(tenant) if state.tenants is not None and tenant else None
        socket = ASGITransport(receive, send, scope, state.tcp)
        link: Link | None = None
        transport: Transport = socket
        if resumable and state.limits.resume_grace > 0:
            limits = state.limits
            offer = Offer(
                state.resumes,
                tenant.name if tenant is not None else None,
                scope.get("path", ""),
                state.replica_id,
                limits.resume_grace,
            )
            journal = Journal(limits.resume_journal_bytes, limits.resume_journal_seconds)
            link = Link(socket, journal, offer, _ERROR_TEXT[dialect])
            transport = link
        try:
            # Before the upgrade: a connection needs descriptors of its own (the
            # engine's waker), and running out must refuse it with 503, not end it 1011.
            connection = dialect(
                transport,
                state.engine,
                state.limits,
                shutdown=state.shutdown,
                observer=state.observer,
                recording=state.recording,
                tenant=seat,
            )
        except OSError as exc:
            state.observer.connection_refused("connection_limit")
            state.tcp.note("no-descriptors", "refused an upgrade: %s", exc)
            await _refuse_upgrade(
                scope,
                send,
                503,
                "connection_limit",
                "no resources for another connection now; retry",
            )
            return
        if link is not None:
            link.session_id = connection.session_id
        try:
            await send(
                {
                    "type": "websocket.accept",
                    "subprotocol": SUBPROTOCOL if SUBPROTOCOL in offered else None,
                }
            )
        except BaseException:
            connection.lifetime.waker.close()
            raise
        async with self._holding(socket):
            try:
                await connection.run()
            finally:
                if link is not None:
                    link.end()

    @asynccontextmanager
    async def _holding(self, socket: ASGITransport) -> AsyncIterator[None]:
        """Count an accepted WebSocket as open (shutdown waits for it, and may abort it)."""
        state = self.state
        state.connections += 1
        if state.idle.is_set():
            state.idle = trio.Event()
        state.transports.add(socket)
        try:
            yield
        finally:
            state.transports.discard(socket)
            state.connections -= 1
            if state.connections == 0:
                state.idle.set()

    async def _resume(
        self,
        scope: ASGIScope,
        receive: ASGIReceive,
        send: ASGISend,
        dialect: type[NativeConnection | OpenAIConnection | LiveConnection],
        tenant: Tenant | None,
    ) -> None:
        """A resume connection (``?resume=1``): its first message names the session
        (``session.resume``); on success its socket is attached to that session's link
        until it is let go again (docs/resume.md)."""
        state = self.state
        started = trio.current_time()
        address = str((scope.get("client") or ("?",))[0])
        if not state.failed_resumes.allowed(address, started):
            state.observer.connection_refused("resume_limit")
            state.tcp.note("resume-limit", "refused a resume from %s: too many failed", address)
            await _refuse_upgrade(
                scope,
                send,
                429,
                "too_many_requests",
                "too many failed resumes from this address; wait a minute",
            )
            return
        offered = list(scope.get("subprotocols", []))
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": SUBPROTOCOL if SUBPROTOCOL in offered else None,
            }
        )
        socket = ASGITransport(receive, send, scope, state.tcp)
        error = _ERROR_TEXT[dialect]
        async with self._holding(socket):
            asked = await _resume_request(socket)
            if asked is None:
                return
            if isinstance(asked, str):
                state.failed_resumes.failed(address, trio.current_time())
                state.observer.error_sent("invalid_request")
                await _resume_refused(socket, error, "invalid_request", asked)
                return
            token, last_seq = asked
            link = state.resumes.find(
                token,
                tenant.name if tenant is not None else None,
                scope.get("path", ""),
                trio.current_time(),
            )
            result: Resumed | str = "resume_failed"
            if link is not None:
                result = await link.resume(socket, last_seq)
            if isinstance(result, str) and state.shutdown.is_set():
                with trio.move_on_after(1.0):
                    await socket.close(CLOSE_GOING_AWAY, "server shutting down")
                return
            if isinstance(result, str):
                if result == "resume_failed":
                    state.failed_resumes.failed(address, trio.current_time())
                state.observer.error_sent(result)
                await _resume_refused(socket, error, result, RESUME_MESSAGES[result])
                return
            assert link is not None
            state.observer.session_resumed(
                link.session_id, trio.current_time() - started, result.replayed
            )
            timeout = state.limits.send_timeout
            try:
                async with trio.open_nursery() as nursery:
                    if result.replaced_opener is not None:
                        # The opening handler runs the session: this one tells its
                        # socket why it ends.
                        nursery.start_soon(_replace, result.replaced_opener, error, timeout)
                    await result.attachment.released.wait()
            finally:
                link.release(socket)
            if result.attachment.replaced:  # by a later resume: this socket is told why
                with trio.CancelScope(shield=True):
                    await _replace(result.attachment, error, timeout)


LIVE_NO_RESUME: Final = (
    "the Live API has no resume (a dropped connection ends its session, as OpenAI "
    "defines it): drop resumable/resume from the URL; /v1/realtime and "
    "/openai/v1/realtime resume (docs/resume.md)"
)

RESUME_MESSAGES: Final = {
    "resume_failed": (
        "no session to resume: the token is unknown, expired or already used up, "
        "belongs to another key or endpoint, or its grace period is over"
    ),
    "resync_required": (
        "the session's journal no longer holds every event after last_seq (past its "
        "byte or age bound, or acknowledged): start a new session"
    ),
}


def _native_error(code: str, message: str) -> str:
    return native_wire.serialize(
        native_wire.error_event(cast("native_wire.ErrorCode", code), message)
    )


def _openai_error(code: str, message: str) -> str:
    return openai_events.serialize(openai_events.error(message, code=code))


_ERROR_TEXT: Final[dict[type[Any], ErrorText]] = {
    NativeConnection: _native_error,
    OpenAIConnection: _openai_error,
    LiveConnection: _openai_error,
}


async def _resume_request(socket: ASGITransport) -> tuple[str, int] | str | None:
    """The resume connection's first message as ``(token, last_seq)``; why it is not
    a ``session.resume``, or none came in time (a string); None when the client left."""
    with trio.move_on_after(RESUME_FIRST_MESSAGE_SECONDS):
        try:
            frame = await socket.receive()
        except TransportClosed:
            return None
        try:
            small = isinstance(frame, (str, bytes)) and len(frame) <= LINK_MESSAGE_CHARS
            message: Any = json.loads(frame) if small and frame is not None else None
        except (ValueError, RecursionError):
            message = None
        if not isinstance(message, dict) or message.get("type") != "session.resume":
            return "the first message of a resume connection must be session.resume"
        token, last_seq = message.get("token"), message.get("last_seq")
        if not isinstance(token, str) or not token:
            return "session.resume needs 'token': the string session.resumable gave"
        if isinstance(last_seq, bool) or not isinstance(last_seq, int) or last_seq < 0:
            return "session.resume needs 'last_seq': the highest event number received (0: none)"
        return token, last_seq
    return f"no session.resume within {RESUME_FIRST_MESSAGE_SECONDS:g} seconds"


async def _resume_refused(socket: Transport, error: ErrorText, code: str, message: str) -> None:
    """One ``error`` event, then close 1008."""
    with trio.move_on_after(5.0):
        try:
            await socket.send(error(code, message))
            await socket.close(CLOSE_POLICY, message[:120])
        except TransportClosed:
            pass


async def _replace(replaced: Attachment, error: ErrorText, seconds: float) -> None:
    """Tell the connection a resume replaced why it ends (``session_replaced``, close
    4000); bounded: a half-open socket may take nothing, so it is aborted then, or at
    once when a write to it was already stuck."""
    old = replaced.socket
    message = "session resumed on another connection"
    with trio.move_on_after(0 if replaced.stuck else seconds):
        try:
            await old.send(error("session_replaced", message))
            await old.close(CLOSE_REPLACED, message)
            return
        except TransportClosed:
            return
    abort: Callable[[], object] | None = getattr(old, "abort", None)
    if abort is not None:
        abort()


def _finish_shielded(send: ASGISend) -> ASGISend:
    """``send`` with the response's last message shielded from cancellation.

    Quart-trio cancels the request's tasks as soon as the app has answered, and that
    cancel reached Hypercorn while it was ending the connection after the last body
    chunk (``Connection: close``): the close was skipped and the socket stayed open
    until the client closed it. Hypercorn already shields the write itself; this
    only lets the close that follows it run.
    """

    async def finish(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with trio.CancelScope(shield=True):
                await send(message)
        else:
            await send(message)

    return finish


_REFUSAL_REASONS: Final[dict[str, RefusalReason]] = {
    "unauthorized": "unauthorized",
    "forbidden_origin": "forbidden_origin",
    "forbidden_host": "forbidden_host",
    "draining": "draining",
    "http_version_not_supported": "http_version",
}


async def _refuse_upgrade(
    scope: ASGIScope,
    send: ASGISend,
    status: int,
    code: str,
    message: str,
    *,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """An HTTP error before the upgrade where the server supports it (Hypercorn does)."""
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        return
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


def create_app(state: ServerState) -> RealtimeApp:
    """The whole server as one ASGI app (WebSocket fast path + Quart-trio), with
    Hypercorn's connections guarded (realtime.http.guard) wherever Hypercorn serves it."""
    install()
    return RealtimeApp(state, create_http_app(state))


def create_http_app(state: ServerState) -> QuartTrio:
    # Quart's own static route is off: only the files shipped in realtime/static are
    # served, by name, so any other path is a plain 404 (a name too long for the file
    # system made Quart's route fail with a 500 and a logged traceback).
    app = QuartTrio(__name__, static_folder=None)
    shipped = {path.name: path for path in STATIC_DIR.iterdir() if path.is_file()}

    def public(path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)

    def refuse_http(reason: HTTPRefusalReason, why: str) -> None:
        """Count a refused request and say so in one rate-limited log line."""
        state.observer.http_refused(reason)
        client = request.scope.get("client") or ("?", 0)
        state.tcp.note(
            "http-" + reason, "refused %s from %s:%s: %s", request.method, *client[:2], why
        )

    @app.before_request
    async def check_host() -> Response | None:
        refused = host_refusal(state, request.headers.get("Host"), request.scope.get("server"))
        if refused is None:
            return None
        refuse_http("forbidden_host", refused[2])
        return _error(*refused)

    @app.before_request
    async def check_key() -> Response | None:
        if state.tenants is None or public(request.path):
            return None
        if key_holder(state, request.headers.get("Authorization")) is not None:
            return None
        refuse_http("unauthorized", "missing or wrong API key")
        return _error(
            401, "unauthorized", "missing or wrong API key: send 'Authorization: Bearer <key>'"
        )

    @app.get("/health")
    async def health() -> tuple[dict[str, Any], int]:
        engine = state.engine
        alive = engine.alive
        model = engine.loaded_model
        body = {
            "status": "ok" if alive else "unavailable",
            "model": model.model_id if model is not None else None,
            "engine_alive": alive,
            "session_active": engine.is_reserved(),
            "sessions_active": engine.reserved,
            "detached": state.detached(),
            "resume_tails": state.tails(),
            "capacity": engine.capacity,
            "batch_frames": engine.batch_frames,
            "cpu_blas": cpu_blas.active().name,
            "version": __version__,
        }
        # What the cache holds and how often it hit tells one client about the others'
        # prompts: only a caller with a key sees it where keys are asked for.
        if isinstance(model, CachesPrompts) and (
            state.tenants is None or key_holder(state, request.headers.get("Authorization"))
        ):
            body["prompt_cache"] = attrs.asdict(model.prompt_cache_figures())
        if not alive:
            body["reason"] = engine.dead_reason
        return body, 200 if alive else 503

    @app.get("/ready")
    async def ready() -> tuple[dict[str, Any], int]:
        """Readiness: 200 only when a new conversation would be served now.

        ``?allow_busy=1`` does not fail when every slot is held: for a balancer that
        already sends each replica at most ``--max-sessions`` connections (HAProxy
        ``maxconn N``), so a replica counts as free the moment a socket closes and a
        full fleet queues. A replica whose measured step time admits no more
        (``overloaded``) is not ready either way.
        """
        engine = state.engine
        reason: str | None = None
        if not engine.alive:
            reason = "engine_unavailable" if engine.loaded_model is not None else "loading"
        elif state.draining.is_set() or state.shutdown.is_set():
            reason = "draining"
        elif (refusal := engine.refusal()) is not None and (
            refusal == "overloaded" or request.args.get("allow_busy") not in ("1", "true")
        ):
            reason = refusal
        body: dict[str, Any] = {
            "status": "ready" if reason is None else "not_ready",
            "engine_alive": engine.alive,
            "draining": state.draining.is_set(),
            "session_active": engine.is_reserved(),
            "sessions_active": engine.reserved,
            "capacity": engine.capacity,
        }
        if reason is not None:
            body["reason"] = reason
        return body, 200 if reason is None else 503

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), content_type=METRICS_CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        model = state.engine.model
        return {
            "object": "list",
            "data": [
                {
                    "id": model.model_id,
                    "object": "model",
                    "owned_by": "realtime",
                    # The folder name only: the absolute path would tell every
                    # client how the server's disk is laid out.
                    "path": PurePath(model.path).name if model.path else None,
                    "endpoint": "/v1/realtime",
                }
            ],
        }

    async def not_here() -> Response:
        return _error(
            501,
            "not_implemented",
            "this server runs a full-duplex speech model; use the WebSocket endpoint /v1/realtime",
        )

    every_method = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]  # HEAD comes with GET
    app.add_url_rule("/v1/chat/completions", "chat_completions", not_here, methods=every_method)
    app.add_url_rule("/v1/completions", "completions", not_here, methods=every_method)

    async def upgrade_required() -> Response:
        """Plain HTTP at a WebSocket path (a browser tab, curl): 426 naming the WebSocket."""
        path = request.path
        response = _error(
            426,
            "upgrade_required",
            f"{path} is a WebSocket endpoint: connect with ws://{request.host}{path} "
            "(a WebSocket client such as realtime.client or the page at /)",
        )
        response.headers["Upgrade"] = "websocket"
        response.headers["Connection"] = "Upgrade"
        return response

    for path in (REALTIME_PATH, OPENAI_PATH):
        app.add_url_rule(path, f"upgrade_required{path}", upgrade_required, methods=every_method)

    async def live_unserved(rest: str = "") -> Response:
        """WebRTC's ``POST /live/sessions``, sideband attach, forks, recordings: 501."""
        if request.method == "GET" and not rest:
            return await upgrade_required()
        return _error(501, "not_implemented", LIVE_UNSERVED)

    app.add_url_rule(LIVE_PATH, "live", live_unserved, methods=every_method)
    app.add_url_rule(
        f"{LIVE_PATH}/<path:rest>", "live_unserved", live_unserved, methods=every_method
    )

    @app.get("/")
    async def index() -> Response:
        return await send_file(shipped["index.html"])

    @app.get("/static/<path:name>")
    async def static(name: str) -> Response:
        path = shipped.get(name)
        if path is None:
            return _error(404, "not_found", "no such file")
        return await send_file(path)

    return app
