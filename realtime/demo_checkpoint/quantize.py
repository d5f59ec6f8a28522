"""Quantization as the real 4/8-bit uploads have it: the LLM and its vocabulary matrices."""

from __future__ import annotations

from realtime.demo_checkpoint.config import QUANT_GROUP_SIZE
from realtime.demo_checkpoint.weights import Array

_VOCABULARY_MATRICES = ("stt_model.embed_tokens", "stt_model.lm_head", "stt_model.function_head")


def _quantizable(name: str, value: Array) -> bool:
    module = name.removesuffix(".weight")
    return (
        name.endswith(".weight")
        and value.ndim == 2
        and value.shape[-1] % QUANT_GROUP_SIZE == 0
        and (name.startswith("stt_model.llm.") or module in _VOCABULARY_MATRICES)
    )


def quantize(weights: dict[str, Array], bits: int) -> dict[str, Array]:
    """Packed weights plus ``scales`` and ``biases``, made by MLX's own ``mx.quantize``."""
    import mlx.core as mx
    import numpy as np

    out: dict[str, Array] = {}
    for name, value in weights.items():
        if not _quantizable(name, value):
            out[name] = value
            continue
        module = name.removesuffix(".weight")
        packed, scales, biases = mx.quantize(
            mx.array(value), group_size=QUANT_GROUP_SIZE, bits=bits
        )
        mx.eval(packed, scales, biases)
        out[name] = np.array(packed)
        out[f"{module}.scales"] = np.array(scales)
        out[f"{module}.biases"] = np.array(biases)
    return out
