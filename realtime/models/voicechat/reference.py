"""The reference session: mlx-vlm's own streaming step, with its per-stage timings.

A session opened with ``profile=True`` runs mlx-vlm's ``push_audio`` and ``flush``
themselves, one session at a time (never batched, no tool results): the measurement
the project's own frame step (:class:`~realtime.models.voicechat.session.VoiceChatSession`)
is compared against (``realtime generate --stream --profile``, ``benchmarks.evalshare``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from mlx_vlm.models.nemotron_voicechat import VoiceChatContextLimitError

from realtime.models.base import ContextLimitReached, InferenceError, ModelEvent, Samples
from realtime.models.checkpoint import one_line
from realtime.models.voicechat.events import convert, mark_turn_ends
from realtime.models.voicechat.session import Timeline

log = logging.getLogger(__name__)


class ReferenceSession(Timeline):
    """One streaming timeline over mlx-vlm's ``VoiceChatStreamingSession`` opened with
    ``profile=True``, its frames run by mlx-vlm's own step."""

    def push_audio(self, samples: Samples, sample_rate: int) -> list[ModelEvent]:
        from realtime.models.voicechat.keys import drawing_from

        self._check_open()
        chunk = np.asarray(samples, dtype=np.float32)
        if chunk.ndim != 1:
            raise InferenceError(f"audio must be mono 1-D samples, got shape {chunk.shape}")
        try:
            with drawing_from(self._key):
                events = self._inner.push_audio(chunk, sample_rate=sample_rate)
        except VoiceChatContextLimitError as exc:
            self.at_limit()
            assert self._failed is not None
            raise ContextLimitReached(self._failed) from exc
        except ValueError as exc:  # wrong sample rate or shape: the session is intact
            raise InferenceError(one_line(str(exc))) from exc
        except Exception as exc:
            log.exception("VoiceChat frame failed")
            raise self.failed(exc) from exc
        converted = [convert(e, self._figures) for e in events]
        return mark_turn_ends(self._inner, converted, self._figures.eos_token_id)

    def flush(self, pad_partial: bool) -> list[ModelEvent]:
        from realtime.models.voicechat.keys import drawing_from

        if self._inner.closed:
            return []
        pad = pad_partial and self._failed is None
        try:
            with drawing_from(self._key):
                events = self._inner.flush(pad_partial=pad)
        except Exception as exc:
            log.exception("VoiceChat flush failed")
            self.failed(exc)
            if not self._inner.closed:
                with drawing_from(self._key):
                    events = self._inner.flush(pad_partial=False)
                return [convert(e, self._figures) for e in events]
            assert self._failed is not None
            raise InferenceError(self._failed) from exc
        return [convert(e, self._figures) for e in events]

    def cancel(self) -> list[ModelEvent]:
        return [convert(e, self._figures) for e in self._inner.cancel()]

    def profile_summary(self, drop_first: int = 1) -> dict[str, Any]:
        """mlx-vlm's per-stage frame timings, the first ``drop_first`` frames left out."""
        summary: dict[str, Any] = self._inner.profile.summary(drop_first=drop_first)
        return summary
