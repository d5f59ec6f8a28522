"""Opening a VoiceChat session in slices: the options checked, the system prompt's prefill
shared and cached (:mod:`realtime.models.voicechat.prompt`), then mlx-vlm's streaming
session given the stored parts."""

from __future__ import annotations

import logging
from typing import Any

import attrs
import numpy as np

from realtime.models.base import ModelFigures, PromptUse, SessionInitializationError
from realtime.models.checkpoint import one_line
from realtime.models.voicechat.prompt import (
    STEPS_PER_SLICE,
    LanguagePart,
    Prefill,
    PromptStates,
    VoicePart,
)
from realtime.models.voicechat.reference import ReferenceSession
from realtime.models.voicechat.session import VoiceChatSession

log = logging.getLogger(__name__)


def check_seed(seed: object) -> int:
    """``seed`` as mlx-vlm takes it; SessionInitializationError for anything else."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise SessionInitializationError(f"seed must be an integer, got {seed!r}")
    value = int(seed)
    if not 0 <= value < 2**63:
        raise SessionInitializationError(f"seed must be in 0..2**63-1, got {value}")
    return value


@attrs.define(slots=True, eq=False)
class VoiceChatOpening:
    """A VoiceChat session opened in slices (:class:`realtime.models.base.Opening`).

    mlx-vlm opens a streaming session in its constructor: seed, TTS voice warm-up,
    then the system prompt prefilled one full timeline step (language model and TTS)
    per token, all in one call, during which nothing else could run. Here the
    prompt's prefill runs in slices of its own
    (:class:`realtime.models.voicechat.prompt.Prefill`: a few language-model steps a
    slice, and as many TTS steps while the seed's voice chain is shorter than the
    prompt), shared by every
    opening of that prompt and seed under way, and stored in the model's prompt cache;
    the opening's own session is then the constructor with a blank prompt (mlx-vlm
    skips a blank one) given copies of the stored parts. A prompt stored whole opens in
    one slice. The result is the session mlx-vlm's constructor gives, bit for bit
    (tests/engine/test_isolation.py, tests/models/test_prompt_cache.py). Every slice draws
    from its session's own random key (:mod:`realtime.models.voicechat.keys`).
    """

    _runtime: Any
    _figures: ModelFigures
    _prompts: PromptStates
    _system_prompt: str | None = attrs.field(kw_only=True)
    _seed: int = attrs.field(kw_only=True)
    _max_streaming_seconds: float | None = attrs.field(kw_only=True)
    _profile: bool = attrs.field(default=False, kw_only=True)
    _scope: str | None = attrs.field(default=None, kw_only=True)
    """The prompt-cache scope
    (:meth:`~realtime.models.voicechat.model.VoiceChatModel.begin_session`)."""
    _prefill: Prefill | None = attrs.field(default=None, init=False)
    _parts: tuple[LanguagePart, VoicePart] | None = attrs.field(default=None, init=False)
    _use: PromptUse | None = attrs.field(default=None, init=False)
    _steps: int = attrs.field(default=0, init=False)
    _ran: int = attrs.field(default=0, init=False)

    @property
    def most_steps(self) -> int:
        """:data:`~realtime.models.voicechat.prompt.STEPS_PER_SLICE`
        (:class:`~realtime.models.base.SizedSlices`)."""
        return STEPS_PER_SLICE

    @property
    def steps_run(self) -> int:
        return self._ran

    @property
    def steps_left(self) -> int:
        """The shared read's steps left (0 before the first slice and once it is read:
        the next slice begins the opening, or opens the session, whole)."""
        prefill = self._prefill
        return 0 if self._use is None or prefill is None else prefill.steps_left

    def advance(self) -> VoiceChatSession | ReferenceSession | None:
        return self.advance_steps(self.most_steps)

    def advance_steps(self, steps: int) -> VoiceChatSession | ReferenceSession | None:
        """The next slice, its prefill's share at most ``steps`` model steps."""
        self._steps, self._ran = steps, 0
        try:
            if self._use is None:
                self._start()
            elif self._prefill is not None:
                self._wait_for_prefill()
                if self._prefill is None:
                    return None  # read: the session opens in a slice of its own
            if self._use is None or self._prefill is not None:
                return None
            return self._open()
        except SessionInitializationError:
            raise
        except Exception as exc:
            log.debug("opening a VoiceChat session failed", exc_info=True)
            raise SessionInitializationError(
                one_line(str(exc))
                if isinstance(exc, ValueError)
                else f"{type(exc).__name__}: {one_line(str(exc))}"
            ) from exc

    def _start(self) -> None:
        from realtime.models.voicechat.prompt import prompt_ids

        config = self._runtime.model.config
        text = config.default_system_prompt if self._system_prompt is None else self._system_prompt
        ids = tuple(prompt_ids(self._runtime, text))
        if ids:
            self._parts = self._prompts.parts(self._runtime, ids, self._seed, self._scope)
            if self._parts is None:
                self._prefill = self._prompts.join(self._runtime, ids, self._seed, self._scope)
                self._wait_for_prefill()
            else:
                self._prompts.store.count(hit=True)
        self._use = PromptUse(tokens=len(ids), cached=len(ids) if self._parts else 0)

    def _wait_for_prefill(self) -> None:
        prefill = self._prefill
        assert prefill is not None
        self._ran = prefill.advance(self._steps)
        if prefill.done:
            self._parts = prefill.parts()
            self._prefill = None
            self._prompts.leave(prefill)

    def _open(self) -> VoiceChatSession | ReferenceSession:
        from realtime.models.voicechat.prompt import construct, put_language, put_voice

        assert self._use is not None
        inner, key = construct(
            self._runtime, self._seed, self._max_streaming_seconds, self._profile
        )
        if self._parts is not None:
            language, voice = self._parts
            self._parts = None
            put_language(language, inner)
            put_voice(voice, inner, key)
        _check_streaming(inner, self._figures)
        log.info(
            "session opened: %d prompt tokens, %d from the prompt cache",
            self._use.tokens,
            self._use.cached,
        )
        if self._profile:
            return ReferenceSession(inner, self._figures, key, self._use)
        read = self._prompts.read
        chunk = min(read.chunk, STEPS_PER_SLICE) if read.sequence else 0
        return VoiceChatSession(inner, self._figures, key, self._use, tool_chunk=chunk)

    def abandon(self) -> None:
        self._parts = None
        prefill, self._prefill = self._prefill, None
        if prefill is not None:
            self._prompts.leave(prefill)


def _check_streaming(inner: Any, figures: ModelFigures) -> None:
    """The streaming session must cut and speak what the figures say: the server slices
    appends and the clients frame audio by them."""
    seen = (inner.input_sample_rate, inner.frame_samples, inner.output_sample_rate)
    want = (figures.input_sample_rate, figures.frame_samples, figures.output_sample_rate)
    if seen != want:
        inner.cancel()
        raise SessionInitializationError(
            f"the streaming session runs {seen[1]}-sample frames at {seen[0]} Hz in, "
            f"{seen[2]} Hz out; the model's figures say {want[1]} at {want[0]} Hz, {want[2]} Hz"
        )
