"""Quantization as the real 4/8-bit uploads have it: the LLM and its vocabulary matrices."""

from __future__ import annotations

import mlx.core as mx

from realtime.demo.checkpoint.config import QUANT_GROUP_SIZE
from realtime.demo.checkpoint.weights import Array

_VOCABULARY_MATRICES = ("stt_model.embed_tokens", "stt_model.lm_head", "stt_model.function_head")


def _quantizable(name: str, value: Array) -> bool:
    module = name.removesuffix(".weight")
    return (
        name.endswith(".weight")
        and value.ndim == 2
        and value.shape[-1] % QUANT_GROUP_SIZE == 0
        and (name.startswith("stt_model.llm.") or module in _VOCABULARY_MATRICES)
    )


def quantized(name: str, value: Array, bits: int) -> list[tuple[str, Array]]:
    """One checkpoint tensor as the real uploads store it at ``bits``: packed, with its
    ``scales`` and ``biases`` (MLX's own ``mx.quantize``), or as it is."""
    import numpy as np

    if not _quantizable(name, value):
        return [(name, value)]
    module = name.removesuffix(".weight")
    packed, scales, biases = mx.quantize(mx.array(value), group_size=QUANT_GROUP_SIZE, bits=bits)
    mx.eval(packed, scales, biases)
    return [
        (name, np.array(packed)),
        (f"{module}.scales", np.array(scales)),
        (f"{module}.biases", np.array(biases)),
    ]
