"""Weights cast once at load to the dtype they meet.

The real uploads store every tensor that is not quantized in bfloat16, and the network
computes in float32: a bfloat16 ``Linear`` fed float32 casts its whole weight on every
call, every 4-bit matmul casts its scales and biases, so a frame step at B=1 ran about
two thousand ``AsType`` kernels (``python -m benchmarks.graph``). A bfloat16 to float32
cast is exact and the operation after it is the same, so casting once at load gives
the same bits wherever the parameter only ever meets float32; a module whose output
dtype follows its parameters' (an embedding table, a dequantized table, code that
casts its activations to a weight's dtype) would change bits, and stays as stored.
Which modules are cast is a list of name prefixes, each checked bit for bit by its own
test (``tests/models/voicechat/test_cast.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, cast

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

CAST_ONCE: Final = (
    "stt_model.llm.",
    "stt_model.lm_head.",
    "stt_model.function_head.",
    "stt_model.perception.",
    "stt_model.rnnt_decoder.",
    "stt_model.rnnt_joint.",
    "tts_model.tts_model.backbone.",
    "tts_model.tts_model.mog_head.",
    "tts_model.tts_model.embed_code.",
)
"""The parameters (by name prefix) that only ever meet float32 and are cast at load.
Left as stored: the language model's token embedding (a dequantized table whose
output dtype is its scales'), the character encoder, the gated fusion, the codec."""


def castable(
    names_and_values: Iterable[tuple[str, Any]], prefixes: Iterable[str] = CAST_ONCE
) -> list[tuple[str, Any]]:
    """The bfloat16 and float16 parameters under ``prefixes`` (quantized weights and
    integer tables are not cast)."""

    wanted = tuple(prefixes)
    return [
        (name, value)
        for name, value in names_and_values
        if name.startswith(wanted) and value.dtype in (mx.bfloat16, mx.float16)
    ]


def cast_once(model: Any, prefixes: Iterable[str] = CAST_ONCE) -> int:
    """Cast ``model``'s parameters under ``prefixes`` to float32 in place, a module
    group at a time (so the two copies of one group at most are in memory); the bytes
    the model grew by."""

    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    grown = 0
    for prefix in prefixes:
        group = castable(flat, (prefix,))
        if not group:
            continue
        cast_group = [(name, value.astype(mx.float32)) for name, value in group]
        mx.eval(*(value for _, value in cast_group))
        grown += sum(
            int(new.nbytes) - int(old.nbytes)
            for (_, old), (_, new) in zip(group, cast_group, strict=True)
        )
        model.update(tree_unflatten(cast_group))
    return grown
