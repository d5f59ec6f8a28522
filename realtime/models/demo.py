"""A tiny random-weight VoiceChat checkpoint in the real on-disk layout.

It lets the server, the clients and the tests run end to end with no download:
the files look like a real ``mlx-community/NemotronLabs-VoiceChat-11B-*`` folder
(NeMo parameter names, PyTorch tensor layouts, sharded safetensors plus an index,
a Hugging Face tokenizer) and load through the unmodified ``mlx_vlm.load``.
The weights are random, so the model "speaks" noise; a few weights are biased so
that the text, function and transcript channels stay mostly quiet instead of
emitting gibberish every 80 ms frame.

Every build is byte-identical (fixed seeds, sorted keys, no timestamps).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

log = logging.getLogger("realtime.models.demo")

# Bump whenever the bytes this module writes change: cached copies are rebuilt.
BUILDER_VERSION = 1
DEMO_NAME = "realtime-demo-voicechat"
MARKER_FILE = "realtime_demo.json"
QUANT_GROUP_SIZE = 64
_SEED = 20_250_807

_VOCAB_SIZE = 512
_NUM_SPECIALS = 16
_BYTE_OFFSET = _NUM_SPECIALS
_BOS, _EOS, _SILENCE, _PAD = 1, 2, 11, 12
_RNNT_VOCAB = 1024
_RNNT_BLANK = 1024
_LLM_HIDDEN = 64
_CODEBOOK = 128

# Bias strengths, tuned so a few seconds of noise or speech yields some text,
# function and transcript deltas but most frames stay silent (pad / blank).
_BIAS_CHANNEL = 2.5  # constant added to hidden dim 0 by embeddings and audio projection
_TEXT_PAD_GAIN = 1.90  # lm_head[pad, 0]
_FUNCTION_PAD_GAIN = 2.0  # function_head[pad, 0]
_UNREADABLE_PENALTY = -6.0  # head weight on dim 0 for tokens that decode to junk
_RNNT_BLANK_BIAS = 1.5
_RNNT_UNK_BIAS = -20.0

Array = npt.NDArray[Any]


def demo_name(quantize: int | None) -> str:
    """Folder name (and so model id) of the demo checkpoint variant."""
    return DEMO_NAME if quantize is None else f"{DEMO_NAME}-{quantize}bit"


# --------------------------------------------------------------------------- config


def _words(text: str) -> list[str]:
    return text.split()


def _rnnt_vocabulary() -> list[str]:
    """1024 SentencePiece-style pieces: ``<unk>`` first, then word-ish pieces."""
    words = _words(
        "the and you that what this have with your for are can not just know like "
        "yes okay right so well good time here there how about would could think "
        "really want need today maybe hello thanks please sure great sound voice "
        "talk say tell hear play call help make take look go come see work day "
        "one two three four five six seven eight nine ten"
    )
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "w"]
    vowels = ["a", "e", "i", "o", "u", "ay", "ee", "oo"]
    codas = ["", "n", "s", "t", "r", "l", "m", "ng"]
    pieces: list[str] = ["<unk>"]
    seen = set(pieces)

    def add(piece: str) -> None:
        if piece not in seen and len(pieces) < _RNNT_VOCAB:
            seen.add(piece)
            pieces.append(piece)

    for word in words:
        add("\u2581" + word)
    for letter in "abcdefghijklmnopqrstuvwxyz":
        add(letter)
        add("\u2581" + letter)
    for onset in onsets:
        for vowel in vowels:
            for coda in codas:
                add(onset + vowel + coda)
                add("\u2581" + onset + vowel + coda)
    if len(pieces) != _RNNT_VOCAB:
        raise AssertionError(f"RNN-T vocabulary has {len(pieces)} pieces")
    return pieces


def _demo_config(quantize: int | None) -> dict[str, Any]:
    """A tiny config in the schema of the real checkpoints' ``config.json``.

    Dimensions are small but deliberately non-square so a wrong transposition
    in the PyTorch-layout writer fails at load time instead of passing silently.
    """
    config: dict[str, Any] = {
        "model_type": "nemotron_voicechat",
        "architectures": ["NemotronVoiceChatForConditionalGeneration"],
        "text_config": {
            "model_type": "nemotron_h",
            "vocab_size": _VOCAB_SIZE,
            "hidden_size": _LLM_HIDDEN,
            "intermediate_size": 192,
            "num_hidden_layers": 3,
            "max_position_embeddings": 8192,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "attention_bias": False,
            "mamba_num_heads": 4,
            "mamba_head_dim": 32,
            "mamba_proj_bias": False,
            "ssm_state_size": 16,
            "conv_kernel": 4,
            "n_groups": 1,
            "mlp_bias": False,
            "layer_norm_epsilon": 1e-5,
            "use_bias": False,
            "use_conv_bias": True,
            "hybrid_override_pattern": "M*-",
        },
        "audio_config": {
            "preprocessor": {
                "sample_rate": 16000,
                "features": 128,
                "n_fft": 512,
                "window_size": 0.025,
                "window_stride": 0.01,
                "window": "hann",
                "normalize": "NA",
                "pad_to": 0,
            },
            "encoder": {
                "feat_in": 128,
                "n_layers": 1,
                "d_model": 32,
                "n_heads": 2,
                "ff_expansion_factor": 3,
                "subsampling_factor": 8,
                "subsampling_conv_channels": 16,
                "conv_kernel_size": 9,
                "causal_downsampling": True,
                "att_context_size": [[70, 0]],
                "use_bias": True,
            },
            "decoder": {
                "pred_hidden": 24,
                "pred_rnn_layers": 2,
                "vocab_size": _RNNT_VOCAB,
                "blank_as_pad": True,
            },
            "joint": {
                "joint_hidden": 40,
                "activation": "relu",
                "encoder_hidden": 32,
                "pred_hidden": 24,
                "num_classes": _RNNT_VOCAB,
            },
            "output_dim": _LLM_HIDDEN,
            "max_symbols": 2,  # real: 10; the random joint would repeat a piece 10 times
        },
        "tts_config": {
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "sliding_window": 7500,
            "sliding_window_pattern": 2,
            "latent_size": 16,
            "num_quantizers": 31,
            "codebook_size": _CODEBOOK,
            "character_encoder": {
                "hidden_size": 32,  # must equal the TTS width (flag embeddings add to it)
                "intermediate_size": 40,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
                "num_key_value_heads": 2,
                "head_dim": 8,
                "char_vocab_size": 257,
            },
            "mog_head": {
                "intermediate_size": 40,
                "low_rank": 4,
                "num_layers": 1,
                "num_predictions": 16,
            },
        },
        "codec_config": {
            "sample_rate": 22050,
            "base_channels": 8,
            "channel_multipliers": [1, 2, 4],
            "downsample_rates": [7, 7, 9],
            "blocks_per_stage": 1,
            "block_kernel_size": 7,
            "latent_dim": 16,
            "n_fft": 16,
            "hop_length": 4,
            "num_quantizers": 31,
            "codebook_size": _CODEBOOK,
        },
        "bos_token_id": _BOS,
        "eos_token_id": _EOS,
        "pad_token_id": _PAD,
        "silence_token_id": _SILENCE,
        "rnnt_blank_id": _RNNT_BLANK,
        "input_sample_rate": 16000,
        "output_sample_rate": 22050,
        "frame_duration": 0.08,
        "function_channel_weight": 2.0,
        "speaker": "Aria",
        "rnnt_vocabulary": _rnnt_vocabulary(),
    }
    if quantize is not None:
        quantization = {"group_size": QUANT_GROUP_SIZE, "bits": quantize}
        config["quantization"] = dict(quantization)
        config["quantization_config"] = dict(quantization)
    return config


# ------------------------------------------------------------------------ tokenizer


def _byte_alphabet() -> list[str]:
    """The byte-level BPE alphabet: one printable character per byte value, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


_TOKENIZER_WORDS = _words(
    "the and you that what this have with your for are can not just know like yes okay "
    "right so well good time here there how about would could think really want need "
    "today maybe hello thanks please sure great sound voice talk say tell hear play call "
    "help make take look come see work day one two three four five world weather music "
    "question answer morning evening friend happy thing people little"
)


def _tokenizer_tables() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges: 16 specials, 256 bytes, then word merges up to 512."""
    alphabet = _byte_alphabet()
    vocab: dict[str, int] = {}
    for i in range(_NUM_SPECIALS):
        name = {0: "<unk>", 1: "<s>", 2: "</s>"}.get(i, f"<SPECIAL_{i}>")
        vocab[name] = i
    for b, char in enumerate(alphabet):
        vocab[char] = _BYTE_OFFSET + b
    merges: list[tuple[str, str]] = []
    space = alphabet[ord(" ")]
    for word in _TOKENIZER_WORDS:
        for form in (space + word, word):
            current = form[0]
            for char in form[1:]:
                merged = current + char
                if len(vocab) >= _VOCAB_SIZE:
                    return vocab, merges
                if merged not in vocab:
                    vocab[merged] = len(vocab)
                    merges.append((current, char))
                current = merged
    if len(vocab) != _VOCAB_SIZE:
        raise AssertionError(f"tokenizer has {len(vocab)} entries, expected {_VOCAB_SIZE}")
    return vocab, merges


def _tokenizer_json(vocab: dict[str, int], merges: list[tuple[str, str]]) -> str:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    specials = sorted((i, t) for t, i in vocab.items() if i < _NUM_SPECIALS)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for _, t in specials]
    )
    text: str = tokenizer.to_str(pretty=True)
    # Normalise through json so key order and spacing never depend on the library version.
    return json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _readable_token_ids(vocab: dict[str, int]) -> npt.NDArray[np.bool_]:
    """Tokens that decode to plain ASCII words or punctuation (not specials or raw bytes)."""
    alphabet = _byte_alphabet()
    decode = {char: b for b, char in enumerate(alphabet)}
    readable = np.zeros(_VOCAB_SIZE, dtype=np.bool_)
    for token, index in vocab.items():
        if index < _NUM_SPECIALS:
            continue
        data = bytes(decode[c] for c in token)
        text = data.decode("ascii", errors="replace")
        if all(c.isalnum() or c in " .,?!'" for c in text):
            readable[index] = True
    return readable


# -------------------------------------------------------------------------- weights


def _rng(name: str) -> np.random.Generator:
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([_SEED, zlib.crc32(name.encode())]))
    )


def _random_tensor(name: str, template: Array) -> Array:
    """A value for one parameter in MLX layout, from its template's shape and init."""
    if template.dtype != np.float32:
        return template.copy()
    flat = template.reshape(-1)
    constant = flat.size > 0 and bool(np.all(flat == flat[0]))
    if template.ndim <= 1 and (constant or name.endswith("A_log")):
        return template.copy()  # norms, offsets, scalars, deterministic A_log
    rng = _rng(name)
    if template.ndim <= 1:
        return (rng.standard_normal(template.shape, dtype=np.float32) * np.float32(0.02)).astype(
            np.float32
        )
    fan_in = int(np.prod(template.shape[1:]))
    std = np.float32(1.0 / np.sqrt(max(fan_in, 1)))
    return (rng.standard_normal(template.shape, dtype=np.float32) * std).astype(np.float32)


def _isometry(rows: int, cols: int, name: str) -> Array:
    """A ``rows x cols`` matrix with orthonormal columns: it keeps vector norms."""
    q, r = np.linalg.qr(_rng(name).standard_normal((rows, cols)))
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


def _mlx_weights(config: dict[str, Any], vocab: dict[str, int]) -> dict[str, Array]:
    """Random weights in mlx-vlm's own layout, with the demo's calming biases."""
    templates = _template_parameters(config)
    weights = {name: _random_tensor(name, t) for name, t in sorted(templates.items())}
    rng = _rng("biases")

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

    readable = _readable_token_ids(vocab)
    text_head = weights["stt_model.lm_head.weight"]
    text_head *= np.float32(4.0)
    text_head[:, 0] = np.where(readable, 0.0, _UNREADABLE_PENALTY).astype(np.float32)
    # The function head holds the text head's rows for other tokens: it fires on the
    # frames where the text head is most confident (a higher bar), with its own words.
    function_head = text_head.copy()
    ids = np.flatnonzero(readable)
    function_head[ids] = text_head[_rng("function_head.permutation").permutation(ids)]
    for head, gain in ((text_head, _TEXT_PAD_GAIN), (function_head, _FUNCTION_PAD_GAIN)):
        head[_PAD, :] = 0.0
        head[_PAD, 0] = gain
    weights["stt_model.function_head.weight"] = function_head

    joint_enc = weights["stt_model.rnnt_joint.enc.weight"]
    joint_enc[:] = _isometry(joint_enc.shape[0], joint_enc.shape[1], "rnnt_joint.enc") * 0.5
    weights["stt_model.rnnt_joint.enc.bias"][:] = 0.0
    joint_bias = weights["stt_model.rnnt_joint.joint_net.2.bias"]
    joint_bias[_RNNT_BLANK] = _RNNT_BLANK_BIAS
    joint_bias[0] = _RNNT_UNK_BIAS

    # Buffers the real checkpoint fills from its tokenizer and codec.
    prefix = "tts_model.tts_model.embed_subword."
    continuation = weights[prefix + "subword_flag_emb.is_continuation"]
    space = _byte_alphabet()[ord(" ")]
    for token, index in vocab.items():
        if index >= _NUM_SPECIALS and not token.startswith(space):
            continuation[index] = 1
    flags = weights[prefix + "bos_eos_emb.special_flags"]
    flags[_BOS] = 1
    flags[_EOS] = 2
    weights["tts_model.control_codes"] = np.array(
        [_CODEBOOK + 1, _CODEBOOK + 2, _CODEBOOK + 3], dtype=np.int32
    )
    weights["tts_model.codec_silence_tokens"] = rng.integers(
        0, _CODEBOOK, size=weights["tts_model.codec_silence_tokens"].shape, dtype=np.int32
    )
    for name, value in weights.items():
        if name.endswith(".variance"):
            weights[name] = np.full(value.shape, 0.5, dtype=np.float32)
    return weights


def _contiguous(value: Array) -> Array:
    """A C-ordered copy; unlike ``np.ascontiguousarray`` it keeps 0-d scalars 0-d."""
    return np.array(value, order="C", copy=True)


def _codec_stage_start(name: str, config: dict[str, Any]) -> bool:
    """Whether a codec decoder layer is a ConvTranspose1d (stored (in, out, k))."""
    codec = config["codec_config"]
    index = int(name.split(".")[4])
    width = int(codec["blocks_per_stage"]) + 1
    stages = len(codec["downsample_rates"])
    return index < width * stages and index % width == 0


def _to_checkpoint_layout(weights: dict[str, Array], config: dict[str, Any]) -> dict[str, Array]:
    """The inverse of ``Model.sanitize``: NeMo names and PyTorch layouts."""
    out: dict[str, Array] = {}
    for name, value in weights.items():
        if ".dec_rnn.lstm." in name:
            stem, layer, kind = name.rsplit(".", 2)
            if kind == "Wx":
                out[f"{stem}.weight_ih_l{layer}"] = value
            elif kind == "Wh":
                out[f"{stem}.weight_hh_l{layer}"] = value
            else:  # PyTorch keeps two biases that the loader sums.
                half = _rng(name + ".split").standard_normal(value.shape, dtype=np.float32)
                half = (half * np.float32(0.02)).astype(np.float32)
                out[f"{stem}.bias_ih_l{layer}"] = half
                out[f"{stem}.bias_hh_l{layer}"] = (value - half).astype(np.float32)
            continue
        if name == "tts_model.control_codes":
            out["tts_model._control_codes"] = value
            continue
        if name.startswith("tts_model.audio_codec."):
            key = name.replace("prvq.variance_list.", "prvq._variance_list.")
            if name.endswith(".weight") and value.ndim == 3:
                if name.startswith("tts_model.audio_codec.decoder.layers.") and (
                    "dwconv" not in name and _codec_stage_start(name, config)
                ):
                    value = value.transpose(2, 0, 1)
                else:
                    value = value.transpose(0, 2, 1)
            out[key] = _contiguous(value)
            continue
        if name.startswith("stt_model.perception.") and value.ndim == 4:
            value = value.transpose(0, 3, 1, 2)
        elif value.ndim == 3 and (
            name.startswith("stt_model.perception.")
            or (name.startswith("stt_model.llm.") and name.endswith(".conv1d.weight"))
        ):
            value = value.transpose(0, 2, 1)
        out[name] = _contiguous(value)
    # NeMo also stores the mel front end's buffers; the loader rebuilds and drops them.
    window = np.hanning(402)[1:-1].astype(np.float32)
    out["stt_model.perception.preprocessor.featurizer.window"] = window
    out["stt_model.perception.preprocessor.featurizer.fb"] = np.zeros((1, 128, 257), np.float32)
    return out


def _quantize(weights: dict[str, Array], bits: int) -> dict[str, Array]:
    """Quantize the LLM and its three vocabulary matrices, as the real 4/8-bit uploads do."""
    import mlx.core as mx

    out: dict[str, Array] = {}
    for name, value in weights.items():
        module = name.removesuffix(".weight")
        quantizable = (
            name.endswith(".weight")
            and value.ndim == 2
            and value.shape[-1] % QUANT_GROUP_SIZE == 0
            and (
                name.startswith("stt_model.llm.")
                or module
                in (
                    "stt_model.embed_tokens",
                    "stt_model.lm_head",
                    "stt_model.function_head",
                )
            )
        )
        if not quantizable:
            out[name] = value
            continue
        packed, scales, biases = mx.quantize(
            mx.array(value), group_size=QUANT_GROUP_SIZE, bits=bits
        )
        mx.eval(packed, scales, biases)
        out[name] = np.array(packed)
        out[f"{module}.scales"] = np.array(scales)
        out[f"{module}.biases"] = np.array(biases)
    return out


# ---------------------------------------------------------------------------- files


def _json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def _write_shards(directory: Path, tensors: dict[str, Array]) -> list[str]:
    from safetensors.numpy import save_file

    groups = {
        1: {k: v for k, v in tensors.items() if k.startswith("stt_model.")},
        2: {k: v for k, v in tensors.items() if not k.startswith("stt_model.")},
    }
    count = len(groups)
    weight_map: dict[str, str] = {}
    total = 0
    names: list[str] = []
    for number, group in groups.items():
        shard = f"model-{number:05d}-of-{count:05d}.safetensors"
        ordered = {k: _contiguous(group[k]) for k in sorted(group)}
        save_file(ordered, str(directory / shard), metadata={"format": "pt"})
        for key, value in ordered.items():
            weight_map[key] = shard
            total += int(value.nbytes)
        names.append(shard)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(_json_text(index), encoding="utf-8")
    return names


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_demo_checkpoint(directory: str | Path, quantize: int | None = None) -> Path:
    """Write the demo checkpoint into ``directory`` (created if needed) and return it.

    Runs a little MLX (to read parameter shapes and to quantize), on the calling thread.
    """
    if quantize not in (None, 4, 8):
        raise ValueError(f"quantize must be None, 4 or 8, got {quantize!r}")
    started = time.perf_counter()
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    config = _demo_config(quantize)
    vocab, merges = _tokenizer_tables()
    tensors = _to_checkpoint_layout(_mlx_weights(config, vocab), config)
    if quantize is not None:
        tensors = _quantize(tensors, quantize)

    files = _write_shards(path, tensors)
    (path / "config.json").write_text(_json_text(config), encoding="utf-8")
    (path / "tokenizer.json").write_text(_tokenizer_json(vocab, merges), encoding="utf-8")
    tokenizer_config = {
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t, i in sorted(vocab.items(), key=lambda item: item[1])
            if i < _NUM_SPECIALS
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "model_max_length": 131072,
        "pad_token": f"<SPECIAL_{_PAD}>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
    }
    (path / "tokenizer_config.json").write_text(_json_text(tokenizer_config), encoding="utf-8")
    special_tokens = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": f"<SPECIAL_{_PAD}>",
        "unk_token": "<unk>",
    }
    (path / "special_tokens_map.json").write_text(_json_text(special_tokens), encoding="utf-8")
    files += [
        "model.safetensors.index.json",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ]
    for name in files:
        (path / name).chmod(0o644)
    marker = {
        "builder_version": BUILDER_VERSION,
        "description": "realtime demo checkpoint: random weights, speaks noise",
        "files": {name: _sha256(path / name) for name in sorted(files)},
        "quantize": quantize,
    }
    (path / MARKER_FILE).write_text(_json_text(marker), encoding="utf-8")
    (path / MARKER_FILE).chmod(0o644)
    path.chmod(0o755)
    log.info(
        "wrote demo checkpoint %s (%s) in %.2f s",
        path,
        "float32" if quantize is None else f"{quantize}-bit LLM",
        time.perf_counter() - started,
    )
    return path


def is_demo_checkpoint(directory: str | Path) -> bool:
    """A folder this module wrote (any builder version)."""
    return (Path(directory) / MARKER_FILE).is_file()


def demo_checkpoint_is_complete(directory: str | Path, quantize: int | None = None) -> bool:
    """Whether ``directory`` holds an intact demo checkpoint from this builder version."""
    path = Path(directory)
    try:
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        if marker.get("builder_version") != BUILDER_VERSION or marker.get("quantize") != quantize:
            return False
        files: dict[str, str] = marker["files"]
        return bool(all(_sha256(path / name) == digest for name, digest in files.items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def cache_root() -> Path:
    """``$REALTIME_CACHE_DIR`` if set, else the per-user cache folder."""
    override = os.environ.get("REALTIME_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("realtime"))


@contextlib.contextmanager
def _build_lock(root: Path) -> Iterator[None]:
    """Serialise builders across processes where the OS allows it (POSIX)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a supported MLX platform
        yield
        return
    with open(root / ".lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_demo_checkpoint(quantize: int | None = None) -> Path:
    """The cached demo checkpoint, built once (atomically) when missing or stale."""
    root = cache_root() / "demo-models" / f"v{BUILDER_VERSION}"
    target = root / demo_name(quantize)
    if demo_checkpoint_is_complete(target, quantize):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root):
        if demo_checkpoint_is_complete(target, quantize):
            return target
        log.info("building the demo checkpoint into %s", target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            write_demo_checkpoint(staging, quantize)
            if target.exists():
                trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=root))
                os.replace(target, trash / "old")
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def demo_model_command(args: argparse.Namespace) -> int:
    """``realtime demo-model DIR [--quantize 4|8]``: write the demo checkpoint, print its path."""
    from realtime.cli import CliError

    path = Path(args.dir).expanduser()
    quantize: int | None = args.quantize
    if path.exists() and not path.is_dir():
        raise CliError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not is_demo_checkpoint(path):
        raise CliError(f"{path} is not empty and is not a demo checkpoint; choose another DIR")
    parent = path.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=parent))
    except OSError as exc:
        raise CliError(f"cannot write to {parent}: {exc.strerror or exc}") from None
    try:
        write_demo_checkpoint(staging, quantize)
        if path.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=parent))
            os.replace(path, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging, path)
    except OSError as exc:
        raise CliError(f"cannot write the demo checkpoint to {path}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(path.resolve(), flush=True)
    return 0
