"""Random weights in mlx-vlm's own layout, biased so the demo mostly stays quiet.

The weights are random, so the model "speaks" noise; a few are biased so that
the text, function and transcript channels stay mostly quiet instead of
emitting gibberish every 80 ms frame.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from realtime.demo_checkpoint.config import BOS, CODEBOOK, EOS, NUM_SPECIALS, PAD, RNNT_BLANK
from realtime.demo_checkpoint.tokenizer import Vocab, byte_alphabet, readable_token_ids

Array = npt.NDArray[Any]

SEED = 20_250_807

# Bias strengths, tuned so a few seconds of noise or speech yields some text,
# function and transcript deltas but most frames stay silent (pad / blank).
_BIAS_CHANNEL = 2.5  # constant added to hidden dim 0 by embeddings and audio projection
_TEXT_PAD_GAIN = 1.90  # lm_head[pad, 0]
_FUNCTION_PAD_GAIN = 2.0  # function_head[pad, 0]
_UNREADABLE_PENALTY = -6.0  # head weight on dim 0 for tokens that decode to junk
_RNNT_BLANK_BIAS = 1.5
_RNNT_UNK_BIAS = -20.0


def rng(name: str) -> np.random.Generator:
    """A generator of its own per name, so adding a parameter never shifts the others."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([SEED, zlib.crc32(name.encode())]))
    )


def _random_tensor(name: str, template: Array) -> Array:
    """A value for one parameter in MLX layout, from its template's shape and init."""
    if template.dtype != np.float32:
        return template.copy()
    flat = template.reshape(-1)
    constant = flat.size > 0 and bool(np.all(flat == flat[0]))
    if template.ndim <= 1 and (constant or name.endswith("A_log")):
        return template.copy()  # norms, offsets, scalars, deterministic A_log
    gen = rng(name)
    if template.ndim <= 1:
        return (gen.standard_normal(template.shape, dtype=np.float32) * np.float32(0.02)).astype(
            np.float32
        )
    fan_in = int(np.prod(template.shape[1:]))
    std = np.float32(1.0 / np.sqrt(max(fan_in, 1)))
    return (gen.standard_normal(template.shape, dtype=np.float32) * std).astype(np.float32)


def _isometry(rows: int, cols: int, name: str) -> Array:
    """A ``rows x cols`` matrix with orthonormal columns: it keeps vector norms."""
    q, r = np.linalg.qr(rng(name).standard_normal((rows, cols)))
    q = q * np.sign(np.diag(r))[None, :]  # make the factorisation unique
    return q.astype(np.float32)


def _template_parameters(config: dict[str, Any]) -> dict[str, Array]:
    """Parameter names, shapes and constant inits of mlx-vlm's model for ``config``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.nemotron_voicechat import Model, ModelConfig

    model = Model(ModelConfig.from_dict(json.loads(json.dumps(config))))
    params: dict[str, Array] = {}
    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    for name, value in flat:
        mx.eval(value)
        params[name] = np.array(value)
    return params


def mlx_weights(config: dict[str, Any], vocab: Vocab) -> dict[str, Array]:
    """Random weights in mlx-vlm's own layout, with the demo's calming biases."""
    templates = _template_parameters(config)
    weights = {name: _random_tensor(name, t) for name, t in sorted(templates.items())}
    biases = rng("biases")

    # Dimension 0 of the language model's hidden state is a constant "bias channel":
    # every input carries it, no layer writes into it, and the heads read pad from it.
    # The audio projection is an isometry (the encoder output is layer-normed), and the
    # layers write weakly, so the hidden state's norm, and with it how often a head
    # beats pad, hardly depends on how loud or what kind the input is.
    embed = weights["stt_model.embed_tokens.weight"]
    embed[:, 1:] *= np.float32(0.1)  # weak token feedback: channels follow the audio
    embed[:, 0] = _BIAS_CHANNEL / 3.0
    proj = weights["stt_model.perception.proj.weight"]
    proj[0, :] = 0.0
    proj[1:, :] = _isometry(proj.shape[0] - 1, proj.shape[1], "perception.proj")
    proj_bias = weights["stt_model.perception.proj.bias"]
    proj_bias[:] = 0.0
    proj_bias[0] = _BIAS_CHANNEL
    for name, value in weights.items():
        if name.startswith("stt_model.llm.") and name.endswith(
            ("out_proj.weight", "o_proj.weight", "down_proj.weight")
        ):
            value *= np.float32(0.1)
            value[0, :] = 0.0

    readable = readable_token_ids(vocab)
    text_head = weights["stt_model.lm_head.weight"]
    text_head *= np.float32(4.0)
    text_head[:, 0] = np.where(readable, 0.0, _UNREADABLE_PENALTY).astype(np.float32)
    # The function head holds the text head's rows for other tokens: it fires on the
    # frames where the text head is most confident (a higher bar), with its own words.
    function_head = text_head.copy()
    ids = np.flatnonzero(readable)
    function_head[ids] = text_head[rng("function_head.permutation").permutation(ids)]
    for head, gain in ((text_head, _TEXT_PAD_GAIN), (function_head, _FUNCTION_PAD_GAIN)):
        head[PAD, :] = 0.0
        head[PAD, 0] = gain
    weights["stt_model.function_head.weight"] = function_head

    joint_enc = weights["stt_model.rnnt_joint.enc.weight"]
    joint_enc[:] = _isometry(joint_enc.shape[0], joint_enc.shape[1], "rnnt_joint.enc") * 0.5
    weights["stt_model.rnnt_joint.enc.bias"][:] = 0.0
    joint_bias = weights["stt_model.rnnt_joint.joint_net.2.bias"]
    joint_bias[RNNT_BLANK] = _RNNT_BLANK_BIAS
    joint_bias[0] = _RNNT_UNK_BIAS

    # Buffers the real checkpoint fills from its tokenizer and codec.
    prefix = "tts_model.tts_model.embed_subword."
    continuation = weights[prefix + "subword_flag_emb.is_continuation"]
    space = byte_alphabet()[ord(" ")]
    for token, index in vocab.items():
        if index >= NUM_SPECIALS and not token.startswith(space):
            continuation[index] = 1
    flags = weights[prefix + "bos_eos_emb.special_flags"]
    flags[BOS] = 1
    flags[EOS] = 2
    weights["tts_model.control_codes"] = np.array(
        [CODEBOOK + 1, CODEBOOK + 2, CODEBOOK + 3], dtype=np.int32
    )
    weights["tts_model.codec_silence_tokens"] = biases.integers(
        0, CODEBOOK, size=weights["tts_model.codec_silence_tokens"].shape, dtype=np.int32
    )
    for name, value in weights.items():
        if name.endswith(".variance"):
            weights[name] = np.full(value.shape, 0.5, dtype=np.float32)
    return weights
