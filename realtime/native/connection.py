"""``/v1/realtime``: the native rules on the one model pipeline.

:class:`NativeRules` is :class:`~realtime.native.rules.Conversation` with the native
wire's serializer, the seam :mod:`realtime.session.pipeline` drives;
:class:`NativeConnection` is that pipeline speaking it.
"""

from __future__ import annotations

from typing import ClassVar

from realtime.limits import Limits
from realtime.models.base import RealtimeModel
from realtime.native import wire as protocol
from realtime.native.rules import Conversation
from realtime.observe import SessionOutcome
from realtime.session.pipeline import Connection
from realtime.session.rules import DialectFactory, Event, Refusal


class NativeRules(Conversation):
    """``/v1/realtime``: :class:`Conversation` with the native protocol's serializer."""

    audio_event: ClassVar[str] = protocol.AUDIO_DELTA

    @classmethod
    def new(cls, model: RealtimeModel, limits: Limits, now: float) -> NativeRules:
        return cls(
            protocol.new_session_id(),
            limits,
            model_id=model.model_id,
            model_path=model.path,
            now=now,
            count_tokens=model.count_tokens,
            figures=model.figures,
        )

    def created_event(self) -> Event:
        return protocol.session_created(self.session_id, self.figures)

    def refusal_event(self, code: Refusal, message: str) -> Event:
        wire: protocol.ErrorCode = "server_busy" if code == "server_busy" else "inference_error"
        return protocol.error_event(wire, message)

    def serialize(self, event: Event) -> str:
        return protocol.serialize(event)

    def ending(self) -> tuple[SessionOutcome, str]:
        return self.outcome or "client_gone", self.close_reason


class NativeConnection(Connection):
    """Runs one ``/v1/realtime`` client's session; ``run`` returns when it is over."""

    dialect: ClassVar[DialectFactory] = NativeRules.new
