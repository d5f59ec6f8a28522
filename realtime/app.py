"""The Quart-trio application: ``/v1/realtime``, health, models, the browser page.

Authentication and the Origin policy run before the WebSocket upgrade, so a
refused client gets a plain HTTP 401/403 and never a session.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Sequence
from typing import Any, Final
from urllib.parse import urlsplit

import attrs
import trio
from quart import Response, jsonify, request, websocket
from quart_trio import QuartTrio

from realtime import __version__
from realtime.connection import Connection, TransportClosed
from realtime.engine import Engine
from realtime.limits import Limits

log = logging.getLogger("realtime.app")

SUBPROTOCOL: Final = "realtime"
KEY_SUBPROTOCOL_PREFIX: Final = "realtime-key."
PUBLIC_PATHS: Final = ("/", "/favicon.ico")
PUBLIC_PREFIXES: Final = ("/static/",)


@attrs.define(slots=True)
class ServerState:
    engine: Engine
    limits: Limits = attrs.field(factory=Limits)
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    shutdown: trio.Event = attrs.field(factory=trio.Event)
    connections: int = 0
    idle: trio.Event = attrs.field(factory=trio.Event)
    """Set whenever no connection is open, for graceful shutdown."""

    def __attrs_post_init__(self) -> None:
        self.idle.set()


class QuartTransport:
    """Quart's WebSocket as the lifecycle's :class:`~realtime.connection.Transport`."""

    def __init__(self) -> None:
        self._ws = websocket._get_current_object()  # type: ignore[attr-defined]

    async def receive(self) -> str | bytes | None:
        data: str | bytes | None = await self._ws.receive()
        return data

    async def send(self, text: str) -> None:
        await self._ws.send(text)

    async def close(self, code: int, reason: str) -> None:
        await self._ws.close(code, reason)


def _error(status: int, code: str, message: str) -> Response:
    response = jsonify({"error": {"code": code, "message": message}})
    response.status_code = status
    return response


def _bearer_ok(header: str | None, key: str) -> bool:
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def _subprotocol_key_ok(offered: Sequence[str], key: str) -> bool:
    ok = False
    for proto in offered:
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
            candidate = proto[len(KEY_SUBPROTOCOL_PREFIX) :]
            ok |= hmac.compare_digest(candidate.encode(), key.encode())
    return ok


def origin_allowed(origin: str | None, host: str | None, allowed: Sequence[str]) -> bool:
    """No Origin (a non-browser client) and same-origin pass; others must be listed."""
    if origin is None:
        return True
    if "*" in allowed or origin.rstrip("/") in {a.rstrip("/") for a in allowed}:
        return True
    netloc = urlsplit(origin).netloc
    return bool(host) and netloc.lower() == (host or "").lower()


def create_app(state: ServerState) -> QuartTrio:
    app = QuartTrio(__name__, static_folder="static", static_url_path="/static")
    app.config["realtime"] = state

    def public(path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)

    @app.before_request
    async def check_key() -> Response | None:
        if state.api_key is None or public(request.path):
            return None
        if _bearer_ok(request.headers.get("Authorization"), state.api_key):
            return None
        return _error(
            401, "unauthorized", "missing or wrong API key: send 'Authorization: Bearer <key>'"
        )

    @app.before_websocket
    async def check_upgrade() -> Response | None:
        if state.api_key is not None and not (
            _bearer_ok(websocket.headers.get("Authorization"), state.api_key)
            or _subprotocol_key_ok(websocket.requested_subprotocols, state.api_key)
        ):
            return _error(
                401,
                "unauthorized",
                "missing or wrong API key: send "
                "'Authorization: Bearer <key>' or the subprotocol "
                f"'{KEY_SUBPROTOCOL_PREFIX}<key>'",
            )
        origin = websocket.headers.get("Origin")
        if not origin_allowed(origin, websocket.headers.get("Host"), state.allowed_origins):
            return _error(
                403,
                "forbidden_origin",
                f"origin {origin!r} may not open "
                "/v1/realtime; start the server with --allowed-origin to allow it",
            )
        return None

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
            "version": __version__,
        }
        if not alive:
            body["reason"] = engine.dead_reason
        return body, 200 if alive else 503

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
                    "path": model.path,
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

    app.add_url_rule("/v1/chat/completions", "chat_completions", not_here, methods=["POST"])
    app.add_url_rule("/v1/completions", "completions", not_here, methods=["POST"])

    @app.get("/")
    async def index() -> Response:
        return await app.send_static_file("index.html")

    @app.websocket("/v1/realtime")
    async def realtime_ws() -> None:
        subprotocol = SUBPROTOCOL if SUBPROTOCOL in websocket.requested_subprotocols else None
        await websocket.accept(subprotocol=subprotocol)
        state.connections += 1
        state.idle = trio.Event() if state.idle.is_set() else state.idle
        try:
            connection = Connection(
                QuartTransport(), state.engine, state.limits, shutdown=state.shutdown
            )
            try:
                await connection.run()
            except TransportClosed:
                pass
        finally:
            state.connections -= 1
            if state.connections == 0:
                state.idle.set()

    return app
