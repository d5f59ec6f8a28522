"""Random weights in mlx-vlm's own layout, biased so the demo mostly stays quiet.

The weights are random, so the model "speaks" noise; a few are biased so that
the text, function and transcript channels stay mostly quiet instead of
emitting gibberish every 80 ms frame.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, Final, cast

import attrs
import mlx.core as mx
import numpy as np
import numpy.typing as npt
from mlx.utils import tree_flatten
from mlx_vlm.models.nemotron_voicechat import Model, ModelConfig

from realtime.demo.checkpoint.config import BOS, EOS, NUM_SPECIALS, PAD, RNNT_BLANK
from realtime.demo.checkpoint.tokenizer import Vocab, byte_alphabet, readable_token_ids

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


def _isometry(rows: int, cols: int, name: str) -> Array:
    """A ``rows x cols`` matrix with orthonormal columns: it keeps vector norms (with
    fewer rows than columns, orthonormal rows: a projection, the nearest it can be)."""
    if rows < cols:
        return _isometry(cols, rows, name).T.copy()
    q, r = np.linalg.qr(rng(name).standard_normal((rows, cols)))
    q = q * np.sign(np.diag(r))[None, :]  # make the factorisation unique
    return q.astype(np.float32)


@attrs.frozen(slots=True)
class Template:
    """One parameter of mlx-vlm's model: its shape and dtype, and its initial value
    where the demo keeps it (1-D and integer parameters: norms, offsets, tables); a
    random matrix's initial value is never computed, so a large preset costs no memory
    here."""

    shape: tuple[int, ...]
    value: Array | None


def parameter_templates(config: dict[str, Any]) -> dict[str, Template]:
    """Parameter names, shapes and kept initial values of mlx-vlm's model for ``config``
    (MLX builds the model lazily: only the kept values are evaluated)."""

    model = Model(ModelConfig.from_dict(json.loads(json.dumps(config))))
    templates: dict[str, Template] = {}
    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    for name, value in flat:
        shape = tuple(int(n) for n in value.shape)
        dtype = np.dtype(str(value.dtype).removeprefix("mlx.core.")).name
        kept = None
        if dtype != "float32" or len(shape) <= 1:
            mx.eval(value)
            kept = np.array(value)
        templates[name] = Template(shape, kept)
    return templates


def _random_tensor(name: str, template: Template, rows: int | None = None) -> Array:
    """A value for one parameter in MLX layout, from its template's shape and init;
    with ``rows``, only the first ``rows`` rows are drawn and the rest are zero."""
    if template.value is not None:
        value = template.value
        if value.dtype != np.float32:
            return value.copy()
        flat = value.reshape(-1)
        constant = flat.size > 0 and bool(np.all(flat == flat[0]))
        if constant or name.endswith("A_log"):
            return value.copy()  # norms, offsets, scalars, deterministic A_log
        gen = rng(name)
        return (gen.standard_normal(value.shape, dtype=np.float32) * np.float32(0.02)).astype(
            np.float32
        )
    shape = template.shape
    gen = rng(name)
    fan_in = int(np.prod(shape[1:]))
    std = np.float32(1.0 / np.sqrt(max(fan_in, 1)))
    if rows is None or rows >= shape[0]:
        out = gen.standard_normal(shape, dtype=np.float32)
    else:
        out = np.zeros(shape, dtype=np.float32)
        gen.standard_normal(dtype=np.float32, out=out[:rows])
    out *= std
    return out


_VOCABULARY: Final = (
    "stt_model.embed_tokens.weight",
    "stt_model.lm_head.weight",
    "stt_model.function_head.weight",
)
"""The language model's vocabulary matrices: only the tokenizer's rows are drawn."""


class DemoWeights:
    """The demo's random weights in mlx-vlm's own layout, with its calming biases,
    made one tensor at a time (:meth:`tensor`), so that writing a checkpoint holds one
    tensor, not the model, in memory."""

    def __init__(self, config: dict[str, Any], vocab: Vocab) -> None:
        self._config = config
        self._vocab = vocab
        self._templates = parameter_templates(config)
        self._tokens = len(vocab)
        rows = self._templates["stt_model.lm_head.weight"].shape[0]
        readable = np.zeros(rows, dtype=np.bool_)
        readable[: self._tokens] = readable_token_ids(vocab)
        self._readable = readable

    def names(self) -> list[str]:
        """Every parameter's name, sorted."""
        return sorted(self._templates)

    def tensor(self, name: str) -> Array:
        """One parameter's value."""
        if name == "stt_model.lm_head.weight":
            return _pad_row(self._text_head(), _TEXT_PAD_GAIN)
        if name == "stt_model.function_head.weight":
            return self._function_head()
        value = self._random(name)
        self._calm(name, value)
        return self._buffer(name, value)

    def _random(self, name: str) -> Array:
        rows = self._tokens if name in _VOCABULARY else None
        return _random_tensor(name, self._templates[name], rows)

    def _text_head(self) -> Array:
        head = self._random("stt_model.lm_head.weight")
        head *= np.float32(4.0)
        head[:, 0] = np.where(self._readable, 0.0, _UNREADABLE_PENALTY).astype(np.float32)
        return head

    def _function_head(self) -> Array:
        # The function head holds the text head's rows for other tokens: it fires on the
        # frames where the text head is most confident (a higher bar), with its own words.
        text_head = self._text_head()
        head = text_head.copy()
        ids = np.flatnonzero(self._readable)
        head[ids] = text_head[rng("function_head.permutation").permutation(ids)]
        return _pad_row(head, _FUNCTION_PAD_GAIN)

    def _calm(self, name: str, value: Array) -> None:
        """The calming biases, in place.

        Dimension 0 of the language model's hidden state is a constant "bias channel":
        every input carries it, no layer writes into it, and the heads read pad from
        it. The audio projection is an isometry (the encoder output is layer-normed),
        and the layers write weakly, so the hidden state's norm, and with it how often
        a head beats pad, hardly depends on how loud or what kind the input is.
        """
        if name == "stt_model.embed_tokens.weight":
            value[:, 1:] *= np.float32(0.1)  # weak token feedback: channels follow the audio
            value[:, 0] = _BIAS_CHANNEL / 3.0
        elif name == "stt_model.perception.proj.weight":
            value[0, :] = 0.0
            value[1:, :] = _isometry(value.shape[0] - 1, value.shape[1], "perception.proj")
        elif name == "stt_model.perception.proj.bias":
            value[:] = 0.0
            value[0] = _BIAS_CHANNEL
        elif name.startswith("stt_model.llm.") and name.endswith(
            ("out_proj.weight", "o_proj.weight", "down_proj.weight")
        ):
            value *= np.float32(0.1)
            value[0, :] = 0.0
        elif name == "stt_model.rnnt_joint.enc.weight":
            value[:] = _isometry(value.shape[0], value.shape[1], "rnnt_joint.enc") * 0.5
        elif name == "stt_model.rnnt_joint.enc.bias":
            value[:] = 0.0
        elif name == "stt_model.rnnt_joint.joint_net.2.bias":
            value[RNNT_BLANK] = _RNNT_BLANK_BIAS
            value[0] = _RNNT_UNK_BIAS

    def _buffer(self, name: str, value: Array) -> Array:
        """Buffers the real checkpoint fills from its tokenizer and codec."""
        prefix = "tts_model.tts_model.embed_subword."
        codebook = int(self._config["tts_config"]["codebook_size"])
        if name == prefix + "subword_flag_emb.is_continuation":
            space = byte_alphabet()[ord(" ")]
            for token, index in self._vocab.items():
                if index >= NUM_SPECIALS and not token.startswith(space):
                    value[index] = 1
        elif name == prefix + "bos_eos_emb.special_flags":
            value[BOS] = 1
            value[EOS] = 2
        elif name == "tts_model.control_codes":
            return np.array([codebook + 1, codebook + 2, codebook + 3], dtype=np.int32)
        elif name == "tts_model.codec_silence_tokens":
            return rng("biases").integers(0, codebook, size=value.shape, dtype=np.int32)
        elif name.endswith(".variance"):
            return np.full(value.shape, 0.5, dtype=np.float32)
        return value


def _pad_row(head: Array, gain: float) -> Array:
    head[PAD, :] = 0.0
    head[PAD, 0] = gain
    return head
