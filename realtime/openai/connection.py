"""``/openai/v1/realtime``: the OpenAI dialect's rules on the one model pipeline.

The rules live in :class:`~realtime.openai.dialect.Dialect`; the pipeline, the
waker, the frame latency and the session report are :mod:`realtime.session.pipeline`'s,
the same as the native endpoint's. :class:`OpenAIRules` is the seam between them:
the dialect already speaks the pipeline's work values (:mod:`realtime.session.work`:
its frames, client audio and the silence its clock feeds, are
:class:`~realtime.session.work.RunAudio`), so the seam only notes the close and hands
the pipeline's results back in the dialect's terms.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from realtime.limits import Limits
from realtime.models.base import ModelEvent, PromptUse, RealtimeModel
from realtime.observe import SessionOutcome
from realtime.openai import events as ev
from realtime.openai.dialect import Dialect
from realtime.openai.dialect import Output as DialectOutput
from realtime.session.close_codes import CLOSE_INTERNAL, Close
from realtime.session.pipeline import Connection
from realtime.session.rules import DialectFactory, Event, Output, Refusal
from realtime.session.work import Backlog, Failure, RunAudio


class OpenAIRules:
    """The OpenAI dialect as the pipeline drives it: :class:`realtime.session.rules.Rules`
    with the capabilities it uses (``FeedsTools``, ``CountsText``, ``WatchesWrites``;
    it never flushes or cancels the model, so not ``EndsTurns``)."""

    audio_event: ClassVar[str] = "response.output_audio.delta"

    def __init__(self, dialect: Dialect, session_id: str, now: float) -> None:
        self.dialect = dialect
        self.session_id = session_id
        self.session_open = False
        self.backlog = Backlog(idle_from=now)
        """Counted by the pipeline; the dialect keeps its own clocks."""
        self.outcome: SessionOutcome = "client_gone"
        self.close_reason = ""

    @classmethod
    def new(cls, model: RealtimeModel, limits: Limits, now: float) -> OpenAIRules:
        session_id = ev.new_id("sess")
        dialect = Dialect(
            session_id,
            model.model_id,
            limits,
            now=now,
            count_tokens=model.count_tokens,
            figures=model.figures,
        )
        return cls(dialect, session_id, now)

    # --- wire ------------------------------------------------------------------------

    def created_event(self) -> Event:
        return ev.session_event("session.created", self.dialect.session)

    def refusal_event(self, code: Refusal, message: str) -> Event:
        return ev.error(message, code=code, type_="server_error")

    def serialize(self, event: Event) -> str:
        return ev.serialize(event)

    # --- the dialect's outputs, handed on ----------------------------------------------

    def _outputs(self, outputs: Iterable[DialectOutput], now: float) -> list[Output]:
        """The dialect's outputs are the pipeline's; a close is noted on its way."""
        out: list[Output] = []
        for item in outputs:
            if isinstance(item, Close):
                self._closing(item)
            out.append(item)
        return out

    def _closing(self, close: Close) -> None:
        self.close_reason = close.reason
        if close.now:
            self.outcome = "stalled_client"
        else:
            self.outcome = "error" if close.code == CLOSE_INTERNAL else "timeout"

    # --- client and clock ------------------------------------------------------------

    def receive(self, frame: str | bytes | None, now: float) -> list[Output]:
        return self._outputs(self.dialect.receive(frame, now), now)

    def check_timeouts(self, now: float) -> list[Output]:
        return self._outputs(self.dialect.tick(now), now)

    def next_check(self, now: float) -> float:
        return self.dialect.next_tick(now)

    # --- the model's side --------------------------------------------------------------

    def begin_audio(self, work: RunAudio) -> list[Output] | None:
        if self.session_open:
            return None
        self.dialect.frame_dropped()  # the model session is not open: not run
        return []

    def keep_submitting(self, tag: int) -> bool:
        return True

    def slice_done(self, tag: int, events: list[ModelEvent] | None, now: float) -> list[Output]:
        if events is None:
            self.dialect.frame_dropped()
            return []
        return self._outputs(self.dialect.frame_done(events), now)

    def slice_failed(self, tag: int, failure: Failure, now: float) -> list[Output]:
        self.dialect.frame_dropped()
        return self._failed(failure, now)

    def _failed(self, failure: Failure, now: float) -> list[Output]:
        outputs = self.dialect.failed(failure.message, lost=failure.lost, now=now)
        return self._outputs(outputs, now)

    def opened(
        self, failure: Failure | None, now: float, *, prompt: PromptUse | None = None
    ) -> list[Output]:
        if failure is not None and failure.lost:
            return self._failed(failure, now)
        self.session_open = failure is None
        message = None if failure is None else failure.message
        use = prompt or PromptUse()
        return self._outputs(
            self.dialect.opened(message, now, cached_tokens=use.cached, prompt_tokens=use.tokens),
            now,
        )

    def fed(self, failure: Failure | None, now: float, tokens: int) -> list[Output]:
        if failure is not None and failure.lost:
            return self._failed(failure, now)
        message = None if failure is None else failure.message
        return self._outputs(self.dialect.fed(message, now, tokens), now)

    def counted(self, text: str, tokens: int | Exception, now: float) -> list[Output]:
        return self._outputs(self.dialect.counted(text, tokens, now), now)

    # --- the socket ------------------------------------------------------------------

    def sending(self, now: float) -> None:
        self.dialect.sending(now)

    def sent(self, now: float) -> None:
        self.dialect.sent(now)

    def connection_lost(self, outcome: SessionOutcome, reason: str) -> None:
        if not self.close_reason:
            self.outcome, self.close_reason = outcome, reason

    def ending(self) -> tuple[SessionOutcome, str]:
        return self.outcome, self.close_reason


class OpenAIConnection(Connection):
    """Runs one client's OpenAI-dialect session; ``run`` returns when it is over."""

    dialect: ClassVar[DialectFactory] = OpenAIRules.new
