"""Hooks through which metrics, logs and benchmarks watch the server.

The connection and the engine call an :class:`Observer` at each step that
someone may want to count or time. The base class does nothing, so a server
without metrics pays one empty method call per hook; Prometheus metrics
(:mod:`realtime.telemetry.metrics`) and the per-hop benchmark (``benchmarks.breakdown``)
subclass it instead of patching private methods. Hooks must be cheap and must
never raise: they run on the per-frame path, some on the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import attrs

CommandKind = Literal["open", "push", "flush", "cancel", "close", "call", "tool_result"]

RefusalReason = Literal[
    "busy",
    "overloaded",
    "unauthorized",
    "forbidden_origin",
    "forbidden_host",
    "draining",
    "engine_unavailable",
    "connection_limit",
    "http_version",
    "tenant_limit",
    "resume_limit",
]
"""Why a connection got no session: a busy slot (1013), a refused upgrade (401/403/503;
505 for a WebSocket over HTTP/2), too many open connections (503 before any request
is read), its tenant's own ``max_sessions`` held already (1013), a client address
past its failed-resume bound (429)."""

HTTPRefusalReason = Literal["unauthorized", "forbidden_host"]
"""Why a plain HTTP request was refused (401, 403)."""

Hop = Literal[
    "append_received", "slice_submitted", "slice_collected", "audio_sending", "audio_sent"
]
"""The trio side's hops of one frame: its append read from the socket, its slice
handed to the engine, its events collected, its audio's socket write begun and done."""

ErrorPlace = Literal["server", "app"]
"""Where an exception ended one connection: Hypercorn's own tasks for it (``server``)
or the ASGI app (``app``); either way only that connection ended."""

DropReason = Literal["opening", "engine_behind", "too_fast"]
"""Why input audio was dropped (OpenAI endpoint): over the backlog bound while the model
opened (the oldest went), or once it runs, with the engine behind a client that paces in
real time, or with the client sending faster than real time (the append was refused)."""

SessionOutcome = Literal[
    "done",
    "cancelled",
    "closed",
    "client_gone",
    "error",
    "timeout",
    "stalled_client",
    "shutdown",
    "resumed",
    "resume_expired",
]
"""How a session ended: committed and answered, cancelled, the client hung up (its close
frame), the client's connection dropped (no close frame), a server error, a timeout
(configure/idle), a client that stopped reading, server shutdown; a connection whose
resumable session went on over another connection (``resumed``, counted per resume, the
session's own end is counted when it ends), a resumable session that nobody resumed
within its grace period (``resume_expired``)."""


@attrs.frozen(slots=True)
class SessionReport:
    """One finished session, for the session-end log line and the metrics."""

    session_id: str
    outcome: SessionOutcome
    duration: float
    """Seconds from accept to close."""
    frames: int
    """Model frames that produced audio for this client."""
    step_seconds: tuple[float, ...]
    """Engine time of each audio slice, in order (for p50/p95)."""
    close_code: int | None
    close_reason: str
    frame_latency: tuple[float, ...] = ()
    """Each frame's latency (its audio received until handed to the socket)."""
    sessions: int = 1
    """Conversations on the engine, this one included, when it started."""
    frame_seconds: float = 0.08
    """One model frame (``ModelFigures.frame_seconds``; VoiceChat's 80 ms)."""
    tenant: str | None = None
    """Whose key opened it (:mod:`realtime.tenants`); None where no key is asked for."""

    @property
    def audio_seconds(self) -> float:
        return self.frames * self.frame_seconds

    @property
    def realtime_factor(self) -> float | None:
        """Model time over audio time: below 1 keeps up with a live speaker."""
        if not self.step_seconds or not self.frames:
            return None
        return sum(self.step_seconds) / self.audio_seconds


class Observer:
    """Every hook the server calls; override the ones you need."""

    # --- engine thread ------------------------------------------------------------

    def command_started(self, kind: CommandKind) -> None:
        """The engine thread starts running a command."""

    def command_finished(self, kind: CommandKind, seconds: float) -> None:
        """The engine thread finished a command (``seconds`` of engine time)."""

    def frame_deadline(self, lateness: float, queued: int) -> None:
        """A frame step finished ``lateness`` seconds after its deadline (negative: in
        time), with ``queued`` commands waiting."""

    def model_stepped(self, rows: int, seconds: float) -> None:
        """One model step ran ``rows`` frames (one per conversation; 1 when time-sliced)
        in ``seconds``; its frames each also report ``command_finished("push")``."""

    # --- trio side ------------------------------------------------------------------

    def connection_refused(self, reason: RefusalReason, tenant: str | None = None) -> None:
        """A client got no session (busy slot or refused upgrade); ``tenant``: whose key
        it carried, where that was known (a refusal after the upgrade)."""

    def http_refused(self, reason: HTTPRefusalReason) -> None:
        """A plain HTTP request was refused (missing key, a Host that is not ours)."""

    def connection_error(self, where: ErrorPlace) -> None:
        """An exception ended one connection (logged once; the server goes on)."""

    def session_started(self, session_id: str, tenant: str | None = None) -> None:
        """A connection holds the slot and was sent ``session.created`` (``tenant``:
        whose key opened it, None where no key is asked for)."""

    def session_opened(self, seconds: float) -> None:
        """``session.update`` ran on the engine (warm-up and prompt prefill)."""

    def session_ended(self, report: SessionReport) -> None:
        """The connection is closed and the slot released."""

    def session_resumed(self, session_id: str, seconds: float, replayed: int) -> None:
        """A resumable session went on over a new connection, ``seconds`` after its
        upgrade, ``replayed`` journal events sent again."""

    def error_sent(self, code: str) -> None:
        """An ``error`` event went to a client."""

    def limit_refused(self, limit: str) -> None:
        """A message was refused by a limit (``max_message_bytes``, ...)."""

    def input_audio_dropped(self, reason: DropReason, seconds: float) -> None:
        """``seconds`` of a client's input audio were dropped, for ``reason``."""

    def frame_sent(self, latency: float) -> None:
        """A frame's audio was handed to the socket, ``latency`` s after its append arrived."""

    def hop(self, hop: Hop, at: float) -> None:
        """A frame passed one hop of the trio side at ``at`` (``time.perf_counter()``):
        the per-hop benchmark's marks (``benchmarks.breakdown``)."""

    def pending_audio(self, session_id: str, seconds: float) -> None:
        """Input audio of one session accepted and not yet run by the model."""

    def send_queue(self, session_id: str, depth: int) -> None:
        """Events queued for one session's socket."""


HOOKS: Final = tuple(
    name for name, value in vars(Observer).items() if callable(value) and not name.startswith("_")
)
"""Every hook's name."""


def _fan_out(calls: tuple[Callable[..., None], ...]) -> Callable[..., None]:
    def call(*args: Any) -> None:
        for one in calls:
            one(*args)

    return call


class Observers(Observer):
    """Several observers as one.

    Built for the per-frame path: each hook is bound, at construction, to exactly the
    observers that override it (a hook nobody overrides stays the base no-op, one
    overriding observer is called directly, several through one loop), so an
    observer that only cares about session ends costs nothing per frame.
    """

    def __init__(self, observers: Sequence[Observer]) -> None:
        self._all = tuple(observers)
        for name in HOOKS:
            base = getattr(Observer, name)
            calls = tuple(getattr(o, name) for o in self._all if getattr(type(o), name) is not base)
            if len(calls) == 1:
                setattr(self, name, calls[0])
            elif calls:
                setattr(self, name, _fan_out(calls))
