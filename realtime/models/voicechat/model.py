"""NemotronLabs VoiceChat through mlx-vlm, adapted to the model seam.

mlx-vlm's ``nemotron_voicechat`` is the reference MLX implementation. The model the
engine serves (:class:`VoiceChatModel`) is here; its jobs are their own modules beside
it: loading (:mod:`.load`), the checkpoint's figures (:mod:`.figures`), opening a
session (:mod:`.opening`), the session and its batched frames (:mod:`.session`),
mlx-vlm's own step for reference (:mod:`.reference`), its events as the project's
values (:mod:`.events`), and VoiceChat's tool format (:mod:`.tools`). Everything here
runs on the engine thread that owns MLX.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs
import mlx.core as mx
import numpy as np

from realtime.limits import PROMPT_CACHE_BYTES
from realtime.models.base import (
    Frame,
    InferenceError,
    ModelFigures,
    RowResult,
    Samples,
    SessionInitializationError,
    ToolInput,
    step_each,
)
from realtime.models.checkpoint import model_id_for, one_line
from realtime.models.prompt_cache import STEP_READ, AheadSlice, CacheFigures, PrefillRead
from realtime.models.voicechat.codes import compile_rounds
from realtime.models.voicechat.figures import figures_of
from realtime.models.voicechat.fused import trace
from realtime.models.voicechat.opening import VoiceChatOpening, check_seed
from realtime.models.voicechat.prompt import PromptStates
from realtime.models.voicechat.session import VoiceChatSession, run_rows, tool_input

if TYPE_CHECKING:
    from realtime.models.state_files import StateFiles

log = logging.getLogger(__name__)


@attrs.frozen(slots=True, eq=False)
class OfflineResult:
    """One offline turn: the whole answer at once (``realtime generate`` without --stream)."""

    samples: Samples
    sample_rate: int
    text: str
    function_text: str
    transcript: str
    frames: int


class VoiceChatModel:
    """A loaded VoiceChat checkpoint (the RealtimeModel the engine serves)."""

    def __init__(
        self,
        runtime: Any,
        path: Path,
        figures: ModelFigures | None = None,
        *,
        cast: bool = True,
        prefill: PrefillRead = STEP_READ,
    ) -> None:
        self._runtime = runtime  # mlx-vlm VoiceChatSession: model + tokenizer
        self._prompts = PromptStates(PROMPT_CACHE_BYTES, read=prefill)
        self._cast = cast
        """The load cast weights and fused modules (part of the state files' key)."""
        self._files: StateFiles | None = None
        self._path = path
        self._model_id = model_id_for(path)
        self._figures = figures_of(runtime.model.config) if figures is None else figures

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def path(self) -> str:
        """The absolute checkpoint folder."""
        return os.path.abspath(self._path)

    @property
    def figures(self) -> ModelFigures:
        """Read from the checkpoint's config when it loaded
        (:func:`~realtime.models.voicechat.figures.figures_of`)."""
        return self._figures

    @property
    def runtime(self) -> Any:
        """mlx-vlm's VoiceChatSession (for tests and tools that compare against it)."""
        return self._runtime

    def begin_session(
        self,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
        prompt_scope: str | None = None,
        profile: bool = False,
    ) -> VoiceChatOpening:
        """Check the options; the opening seeds, warms the TTS voice prompt and prefills
        the system prompt in slices
        (:class:`~realtime.models.voicechat.opening.VoiceChatOpening`)."""
        value = check_seed(seed)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise SessionInitializationError("system_prompt must be a string")
        if max_streaming_seconds is not None and not (
            isinstance(max_streaming_seconds, (int, float))
            and np.isfinite(max_streaming_seconds)
            and max_streaming_seconds > 0
        ):
            raise SessionInitializationError(
                f"max_streaming_seconds must be a number > 0, got {max_streaming_seconds!r}"
            )
        return VoiceChatOpening(
            self._runtime,
            self._figures,
            self._prompts,
            system_prompt=system_prompt,
            seed=value,
            max_streaming_seconds=max_streaming_seconds,
            profile=profile,
            scope=prompt_scope,
        )

    def compile_step(self, batch_sizes: Sequence[int]) -> None:
        """Trace the TTS's compiled refinement rounds for ``batch_sizes`` rows
        (:func:`realtime.models.voicechat.codes.compile_rounds`) and the fused norms
        and rotary embeddings (:func:`realtime.models.voicechat.fused.trace`)."""
        compile_rounds(self._runtime.model.tts_model.tts_model, batch_sizes)
        trace(self._runtime.model, batch_sizes)

    def prompt_cache_figures(self) -> CacheFigures:
        """The prompt cache's bound, contents and counts (``/health``, ``/metrics``)."""
        return self._prompts.figures()

    def set_prompt_cache_bytes(self, max_bytes: int) -> None:
        """A new bound for the prompt cache (``--prompt-cache-bytes``), emptying it
        (its files and the chain built ahead stay as set); called on the engine thread
        before any session opens."""
        previous = self._prompts
        self._prompts = PromptStates(max_bytes, self._files, previous.read)
        self._prompts.ahead_seed = previous.ahead_seed
        self._prompts.ahead_tokens = previous.ahead_tokens

    def pin_prompt_cache(self) -> None:
        """Keep the warmed prompts' states whatever later openings need
        (:meth:`realtime.models.voicechat.prompt.PromptStates.pin`)."""
        self._prompts.pin()

    def keep_states(
        self, directory: Path | None, max_bytes: int, *, ahead_seed: int, ahead_tokens: int
    ) -> None:
        """:class:`~realtime.models.prompt_cache.KeepsStates`: the state files (keyed by
        :meth:`state_identity`) and the chain built ahead; empties the cache."""
        from realtime.models.state_files import StateFiles

        self._files = None
        if directory is not None and max_bytes > 0:
            try:
                self._files = StateFiles(directory, max_bytes, self.state_identity(directory))
            except OSError as exc:
                log.warning("prompt states are not kept on disk: %s: %s", directory, exc)
        self.set_prompt_cache_bytes(self._prompts.store.max_bytes)
        self._prompts.ahead_seed = ahead_seed
        self._prompts.ahead_tokens = ahead_tokens

    def state_identity(self, directory: Path) -> dict[str, object]:
        """Everything a prompt state's bits depend on besides its prompt and seed: the
        checkpoint's contents, MLX's and mlx-vlm's versions, the device and backend,
        the CBLAS, the load-time casts and fused modules."""
        from importlib.metadata import version

        from realtime import cpu_blas
        from realtime.models.state_files import checkpoint_digest

        folder = Path(self.path)
        files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
        return {
            "checkpoint": checkpoint_digest(files, directory),
            "mlx": version("mlx"),
            "mlx_vlm": version("mlx-vlm"),
            "device": str(mx.default_device()),
            "metal": bool(mx.metal.is_available()),
            "cuda": bool(getattr(getattr(mx, "cuda", None), "is_available", lambda: False)()),
            "cpu_blas": cpu_blas.active().describe(),
            "cast": self._cast,
            "fused": self._cast,
        }

    def ahead(self, steps: int, quiet: bool) -> AheadSlice:
        """:class:`~realtime.models.prompt_cache.KeepsStates`
        (:meth:`~realtime.models.voicechat.prompt.PromptStates.ahead`)."""
        return self._prompts.ahead(self._runtime, steps, quiet)

    def step(self, frames: Sequence[Frame]) -> list[RowResult]:
        """The sessions' frames as one batched frame step
        (:func:`~realtime.models.voicechat.session.run_rows`); sessions opened with
        ``profile=True`` (:class:`~realtime.models.voicechat.reference.ReferenceSession`,
        mlx-vlm's own step) one after another."""
        sessions = [session for session, _, _ in frames]
        if not all(isinstance(s, VoiceChatSession) for s in sessions):
            return step_each(frames)
        rows = [(cast("VoiceChatSession", s), samples, rate) for s, samples, rate in frames]
        return run_rows(rows, self._figures)

    def tool_input(self, output: str) -> ToolInput:
        """:class:`~realtime.models.base.PreparesToolResults` (the tokenizer only)."""
        return tool_input(self._runtime.tokenizer, output)

    def count_tokens(self, text: str) -> int:
        """Prefill steps for ``text`` as the system prompt: its tokens plus BOS and EOS
        (mlx-vlm skips a blank prompt)."""
        if not text.strip():
            return 0
        ids = self._runtime.tokenizer.encode(text, add_special_tokens=False)
        return len(ids) + 2

    def generate_offline(
        self,
        samples: Samples,
        *,
        system_prompt: str | None,
        seed: int,
        max_seconds: float | None = None,
    ) -> OfflineResult:
        """mlx-vlm's offline path: perceive all audio at once, then decode every frame."""

        value = check_seed(seed)
        max_frames = None
        if max_seconds is not None:
            max_frames = max(2, int(max_seconds / self._figures.frame_seconds))
        try:
            result = self._runtime.generate(
                mx.array(np.asarray(samples, dtype=np.float32)),
                system_prompt=system_prompt,
                seed=value,
                max_frames=max_frames,
                extra_decoding_seconds=0.0,
            )
            audio = np.array(result.audio, dtype=np.float32).reshape(-1)
        except Exception as exc:
            raise InferenceError(f"{type(exc).__name__}: {one_line(str(exc))}") from exc
        tokenizer = self._runtime.tokenizer
        hidden = self._figures.hidden_token_ids
        function_ids = [int(t) for t in np.array(result.function_tokens).tolist()]
        function_text = tokenizer.decode(
            [t for t in function_ids if t not in hidden], skip_special_tokens=False
        )
        return OfflineResult(
            samples=audio,
            sample_rate=int(result.sample_rate),
            text=str(result.text),
            function_text=str(function_text),
            transcript=str(result.user_transcript or ""),
            frames=int(np.array(result.text_tokens).shape[0]),
        )

    def clear_cache(self) -> None:

        # Let queued device work finish first, so a closed session leaves nothing
        # running on MLX's stream worker when its buffers are freed.
        mx.synchronize()
        mx.clear_cache()


__all__ = ["OfflineResult", "VoiceChatModel"]
