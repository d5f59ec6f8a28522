"""The sequence prefill (``--prefill sequence``): a prompt's language-model part read
many tokens to one forward pass.

mlx-vlm's constructor reads a system prompt one timeline step a token. Its language
model's input at step ``i`` is ``embed(pad) + prompt[i] + w * embed(pad)``: the
previous text and function tokens are pad throughout (nothing is generated), so no
input depends on an output, and the language model can read a run of them in one
pass over its caches (the Mamba-2 layers' chunked scan, causal attention from the
cache's offset), as every LLM server reads a prompt. The values are the same
function of the prompt; the last bits are not, since a pass over ``n`` positions
sums in another order than ``n`` passes over one (the matrix products' blocking, the
scan's segment sums), so this read is never the default and its states are keyed
apart (:class:`realtime.models.prompt_cache.PrefillRead`'s ``tag``). A chunk of one
token is the step read's very call, bit for bit.

The voice part (the TTS side of the prefill) does not change: it is the seed's voice
chain either way (:mod:`realtime.models.voicechat.prompt`).

A tool result's feed has the same property: its steps' language-model inputs are pad
on the text channel, encoded silence on the user's and, on the function channel, the
previous step's forced response token (the first step's previous tokens are the
session's last), all known before it starts; only the last step's prediction is read.
:class:`SequenceToolResult` feeds it a few steps a slice: their language-model inputs in
one pass, then their TTS steps one by one (they follow the session's own voice and key,
as :func:`realtime.models.voicechat.step.inserted_step` runs them), and only then the
timeline's token lists and index, so a slice leaves the language model, the TTS and the
timeline in step, as the step feed's does. With a chunk of one it is the step feed's
every call, bit for bit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import mlx.core as mx
import numpy as np

if TYPE_CHECKING:
    from realtime.models.voicechat.session import VoiceChatSession

log = logging.getLogger(__name__)


def read_chunk(runtime: Any, embeds: Any, cache: Any, start: int, end: int) -> None:
    """The prompt's tokens ``start`` to ``end`` (``embeds``: the prompt's embeddings,
    ``[1, tokens, hidden]``) through the language model's ``cache`` in one forward
    pass, built and not evaluated (the caller evaluates the cache): the inputs the
    step read builds a token at a time, built for the run at once (the same
    elementwise sums, so the same input bits)."""
    model = runtime.model
    stt = model.stt_model
    pad = mx.array([[model.config.pad_token_id]], dtype=mx.int32)
    fused = stt.embed_tokens(pad) + embeds[:, start:end]
    fused = fused + model.config.function_channel_weight * stt.embed_tokens(pad)
    stt(fused, cache=cache)  # the heads' outputs are never evaluated: nothing reads them


class SequenceToolResult:
    """A tool's output fed ``chunk`` inserted steps a slice (the tool feed of
    ``--prefill sequence``; :class:`~realtime.models.base.ToolResultFeed`)."""

    def __init__(self, session: VoiceChatSession, ids: list[int], chunk: int) -> None:
        self._session = session
        self._ids = ids
        self._chunk = max(1, chunk)
        self._next = 0
        self.closed_with: int | None = None
        """The function token the model predicted after the response (trained: 22)."""

    @property
    def steps(self) -> int:
        return len(self._ids) + 1

    def advance(self) -> bool:
        """Run the next chunk of inserted steps; True once the last has run."""
        session = self._session
        session._check_open()
        try:
            recorded = self._run(min(self._next + self._chunk, self.steps))
        except Exception as exc:
            log.exception("feeding a tool result failed")
            raise session.failed(exc) from exc
        if self._next < self.steps:
            return False
        self.closed_with = recorded
        return True

    def _run(self, end: int) -> int | None:
        from realtime.models.voicechat.keys import drawing_from
        from realtime.models.voicechat.row import StepRow
        from realtime.models.voicechat.step import _silence, pad_tts_step

        session = self._session
        row = StepRow(session._inner, session._key, None, session._seat)
        inner = row.inner
        row.seat.release()
        model, config = inner.model, inner.config
        pad = config.pad_token_id
        start = self._next
        started = inner._timeline_index > 0
        texts = [inner._text_tokens[-1] if started else pad] + [pad] * (end - start - 1)
        first = inner._function_tokens[-1] if started else pad
        functions = [first if start == 0 else self._ids[start - 1]]
        functions += [self._ids[k - 1] for k in range(start + 1, end)]
        stt = model.stt_model
        fused = (
            stt.embed_tokens(mx.array([texts], dtype=mx.int32))
            + _silence(model)
            + config.function_channel_weight * stt.embed_tokens(mx.array([functions], mx.int32))
        )
        output = stt(fused, cache=inner._language_cache)
        last = end == self.steps
        pending = []
        function_id = None
        if last:
            function_id = mx.argmax(output.function_logits[:, -1], axis=-1)
            pending.append(function_id)
        pending += _cache_arrays(inner._language_cache)
        steps = end - start
        with drawing_from(row.key):
            for k in range(steps):
                if k == 0 and not started:
                    continue  # the timeline's first step has no TTS step
                pad_tts_step(inner, pad)
        pending.append(inner._previous_code)
        mx.eval(*pending)
        recorded = None
        if last:
            predicted = int(np.asarray(function_id).reshape(-1)[0])
            forced = [self._ids[k] for k in range(start, end - 1)]
            recorded = predicted
        else:
            forced = [self._ids[k] for k in range(start, end)]
        for token in forced:
            inner._text_tokens.append(pad)
            inner._function_tokens.append(token)
        if last:
            inner._text_tokens.append(pad)
            inner._function_tokens.append(recorded)
        inner._timeline_index += steps
        self._next = end
        return recorded


def _cache_arrays(cache: Any) -> list[Any]:
    """The language model's cache arrays (evaluated with each chunk, so no graph grows
    across slices; when a value is evaluated does not change it)."""
    out: list[Any] = []
    for layer in cache:
        for value in vars(layer).values():
            items = value if isinstance(value, list) else [value]
            out += [a for a in items if isinstance(a, mx.array)]
    return out


__all__ = ["SequenceToolResult", "read_chunk"]
