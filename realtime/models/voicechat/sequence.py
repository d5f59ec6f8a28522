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
:class:`~realtime.models.voicechat.session.SequenceToolResult` feeds it a few steps a
slice: their language-model inputs in one pass, then their TTS steps one by one (they
follow the session's own voice and key, as
:func:`realtime.models.voicechat.step.inserted_step` runs them), and only then the
timeline's token lists and index, so a slice leaves the language model, the TTS and the
timeline in step, as the step feed's does. With a chunk of one it is the step feed's
every call, bit for bit.
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


def cache_arrays(cache: Any) -> list[Any]:
    """The language model's cache arrays (evaluated with each chunk, so no graph grows
    across slices; when a value is evaluated does not change it)."""
    out: list[Any] = []
    for layer in cache:
        for value in vars(layer).values():
            items = value if isinstance(value, list) else [value]
            out += [a for a in items if isinstance(a, mx.array)]
    return out


__all__ = ["cache_arrays", "read_chunk"]
