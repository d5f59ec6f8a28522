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

A tool result's feed (:class:`realtime.models.voicechat.model.VoiceChatToolResult`)
has the same property (its steps' language-model inputs are the previous step's
forced response token on the function channel, pad on the text channel and encoded
silence on the user's; only the last step's prediction is read), but its TTS steps
follow the session's own voice, one step at a time, so only its language part could
be read in chunks: not done here (docs/performance.md says what it would save).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx


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


__all__ = ["read_chunk"]
