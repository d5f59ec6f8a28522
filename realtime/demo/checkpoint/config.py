"""The demo checkpoint's ``config.json``: the real schema with tiny dimensions.

The dimensions are one value, :class:`DemoSize`, so another preset is one more
constant. The tokenizer's size and the token ids are not part of it: the tokenizer
and the calming biases are built around them (a preset may give the language model
more vocabulary rows than the tokenizer has tokens, as the real one has).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

DEMO_NAME = "realtime-demo-voicechat"
QUANT_GROUP_SIZE = 64

VOCAB_SIZE = 512
NUM_SPECIALS = 16
BOS, EOS, SILENCE, PAD = 1, 2, 11, 12
RNNT_VOCAB = 1024
RNNT_BLANK = 1024
CODEBOOK = 128


@attrs.frozen(slots=True)
class DemoSize:
    """The network dimensions of one demo checkpoint preset; the defaults are the served
    demo's (``tiny``, :data:`SMALL`).

    Small but deliberately non-square, so a wrong transposition in the
    PyTorch-layout writer fails at load time instead of passing silently.
    """

    llm_hidden: int = 64
    llm_intermediate: int = 192
    llm_pattern: str = "M*-"
    """One letter per language-model layer (``M`` Mamba, ``*`` attention, ``-`` MLP)."""
    llm_heads: int = 4
    llm_kv_heads: int = 2
    llm_head_dim: int = 32
    mamba_heads: int = 4
    mamba_head_dim: int = 32
    ssm_state: int = 16
    encoder_layers: int = 1
    encoder_width: int = 32
    encoder_heads: int = 2
    encoder_ff_factor: int = 3
    subsampling_channels: int = 16
    predictor_hidden: int = 24
    predictor_layers: int = 2
    joint_hidden: int = 40
    tts_hidden: int = 32
    """Also the character encoder's width: its flag embeddings add to the TTS input."""
    tts_intermediate: int = 48
    tts_layers: int = 2
    tts_heads: int = 2
    tts_kv_heads: int = 1
    tts_head_dim: int = 16
    latent: int = 16
    char_intermediate: int = 40
    char_layers: int = 1
    char_heads: int = 2
    char_kv_heads: int = 2
    char_head_dim: int = 8
    mog_intermediate: int = 40
    mog_low_rank: int = 4
    mog_layers: int = 1
    codec_channels: int = 8
    codec_multipliers: tuple[int, ...] = (1, 2, 4)
    codec_blocks: int = 1
    vocab: int = VOCAB_SIZE
    """Rows of the language model's vocabulary matrices. The tokenizer has
    :data:`VOCAB_SIZE` tokens; rows past them are zero and the heads never choose them
    (:mod:`realtime.demo.checkpoint.weights`), so a larger value only adds their cost."""
    mamba_groups: int = 1
    codebook: int = CODEBOOK
    mog_predictions: int = 16
    tts_window_pattern: int = 2
    """Every n-th TTS layer is global, the rest slide (the real model: 6 of 28)."""
    weight_dtype: str = "float32"
    """How the tensors that are not quantized are stored: ``float32``, or ``bfloat16``
    as in the real uploads (the network computes in float32 either way)."""
    name: str = "tiny"
    """The preset's name (``--size``); every preset but ``tiny`` adds it to the folder name."""
    quantize: int | None = None
    """The bits ``realtime demo-model --size`` quantizes the language model to when
    ``--quantize`` is not given (``deep``: 4, as the real upload it stands for)."""


SMALL = DemoSize()
"""``tiny``: the served demo and the tests' checkpoint (about 3 MB)."""

MEDIUM = attrs.evolve(
    SMALL,
    name="medium",
    llm_hidden=640,
    llm_intermediate=1920,
    llm_pattern="M-M*M-",
    llm_heads=8,
    llm_kv_heads=2,
    llm_head_dim=96,
    mamba_heads=20,
    mamba_head_dim=64,
    ssm_state=64,
    encoder_layers=2,
    encoder_width=192,
    encoder_heads=4,
    encoder_ff_factor=4,
    subsampling_channels=32,
    predictor_hidden=320,
    joint_hidden=288,
    tts_hidden=256,
    tts_intermediate=704,
    tts_layers=3,
    tts_heads=4,
    tts_kv_heads=1,
    tts_head_dim=64,
    latent=48,
    char_intermediate=512,
    char_layers=1,
    char_heads=4,
    char_kv_heads=2,
    char_head_dim=48,
    mog_intermediate=384,
    mog_low_rank=12,
    mog_layers=2,
    codec_channels=16,
)
"""``medium``: for benchmarks only (about 91 MB, 24 M parameters). Sized so that a
frame step is close to the 80 ms frame on a 2-core CPU (docs/performance.md) and is
mostly MLX evaluation (large matrix-vector products that release the GIL), like a real
checkpoint's step and unlike the tiny one's, which is mostly Python graph building."""

NANO_9B_V2_PATTERN: Final = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
"""Nemotron Nano 9B v2's 56 layers: 27 Mamba-2, 25 MLP, 4 attention."""

NANO_9B_V2_STRUCTURE: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "llm_pattern": NANO_9B_V2_PATTERN,
        "llm_heads": 40,
        "llm_kv_heads": 8,
        "mamba_groups": 8,
        "encoder_layers": 24,
        "encoder_heads": 8,
        "encoder_ff_factor": 4,
        "tts_layers": 28,
        "tts_heads": 16,
        "tts_kv_heads": 16,
        "tts_window_pattern": 6,
        "char_heads": 16,
        "char_kv_heads": 16,
        "mog_layers": 3,
        "codec_blocks": 3,
        "weight_dtype": "bfloat16",
    }
)
"""The real model's structure, which ``full`` and ``deep`` share (one place, so the two
cannot drift apart): every layer count, the layer pattern, the head counts and
groupings, the TTS window pattern, and bfloat16 storage; the widths are each preset's."""

FULL = attrs.evolve(
    SMALL,
    name="full",
    **NANO_9B_V2_STRUCTURE,
    llm_hidden=4480,
    llm_intermediate=15680,
    llm_head_dim=128,
    mamba_heads=128,
    mamba_head_dim=80,
    ssm_state=128,
    vocab=131072,
    encoder_width=1024,
    subsampling_channels=256,
    predictor_hidden=640,
    joint_hidden=640,
    tts_hidden=1152,
    tts_intermediate=4608,
    tts_head_dim=72,
    latent=512,
    codebook=1024,
    char_intermediate=4608,
    char_layers=1,
    char_head_dim=72,
    mog_intermediate=4608,
    mog_low_rank=64,
    mog_predictions=1024,
    codec_channels=384,
)
"""``full``: the real checkpoints' dimensions (11.1 B parameters) with random weights,
for accelerator benchmarks: the language model is Nemotron Nano 9B v2's (the VoiceChat
thinker config), the rest mlx-vlm's and mlx-audio's defaults, which are the real
model's. Build it 4-bit (about 9 GB, as the real 4-bit upload); float32 activations
over bfloat16 weights, as the real uploads store them. Not for a 2-core CPU."""

DEEP = attrs.evolve(
    SMALL,
    name="deep",
    **NANO_9B_V2_STRUCTURE,
    quantize=4,
    llm_head_dim=8,
    mamba_heads=8,
    mamba_head_dim=16,
    encoder_width=64,
    tts_head_dim=8,
    char_head_dim=8,
)
"""``deep``: the real model's structure with tiny widths, for counting a frame step's
graph (``python -m benchmarks.graph``): every layer count, the layer pattern, the head
counts and groupings, the TTS window pattern and the storage of the real 4-bit upload
(a 4-bit language model, bfloat16 for the rest), so its graph has the real model's
nodes, waits and casts; widths are tiny's, so it runs on a 2-core CPU."""

SIZES: Final = {size.name: size for size in (SMALL, MEDIUM, DEEP, FULL)}
"""The presets by name, as ``realtime demo-model --size`` and ``--size`` of the
benchmarks spell them."""


def demo_name(quantize: int | None, size: DemoSize = SMALL) -> str:
    """Folder name (and so model id) of the demo checkpoint variant."""
    name = DEMO_NAME if size.name == SMALL.name else f"{DEMO_NAME}-{size.name}"
    return name if quantize is None else f"{name}-{quantize}bit"


def word_list(text: str) -> list[str]:
    """The words of a paragraph (long word lists read better as prose)."""
    return text.split()


def rnnt_vocabulary() -> list[str]:
    """1024 SentencePiece-style pieces: ``<unk>`` first, then word-ish pieces."""
    words = word_list(
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
        if piece not in seen and len(pieces) < RNNT_VOCAB:
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
    if len(pieces) != RNNT_VOCAB:
        raise AssertionError(f"RNN-T vocabulary has {len(pieces)} pieces")
    return pieces


def demo_config(quantize: int | None, size: DemoSize = SMALL) -> dict[str, Any]:
    """A config in the schema of the real checkpoints' ``config.json``."""
    config: dict[str, Any] = {
        "model_type": "nemotron_voicechat",
        "architectures": ["NemotronVoiceChatForConditionalGeneration"],
        "text_config": {
            "model_type": "nemotron_h",
            "vocab_size": size.vocab,
            "hidden_size": size.llm_hidden,
            "intermediate_size": size.llm_intermediate,
            "num_hidden_layers": len(size.llm_pattern),
            "max_position_embeddings": 8192,
            "num_attention_heads": size.llm_heads,
            "num_key_value_heads": size.llm_kv_heads,
            "head_dim": size.llm_head_dim,
            "attention_bias": False,
            "mamba_num_heads": size.mamba_heads,
            "mamba_head_dim": size.mamba_head_dim,
            "mamba_proj_bias": False,
            "ssm_state_size": size.ssm_state,
            "conv_kernel": 4,
            "n_groups": size.mamba_groups,
            "mlp_bias": False,
            "layer_norm_epsilon": 1e-5,
            "use_bias": False,
            "use_conv_bias": True,
            "hybrid_override_pattern": size.llm_pattern,
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
                "n_layers": size.encoder_layers,
                "d_model": size.encoder_width,
                "n_heads": size.encoder_heads,
                "ff_expansion_factor": size.encoder_ff_factor,
                "subsampling_factor": 8,
                "subsampling_conv_channels": size.subsampling_channels,
                "conv_kernel_size": 9,
                "causal_downsampling": True,
                "att_context_size": [[70, 0]],
                "use_bias": True,
            },
            "decoder": {
                "pred_hidden": size.predictor_hidden,
                "pred_rnn_layers": size.predictor_layers,
                "vocab_size": RNNT_VOCAB,
                "blank_as_pad": True,
            },
            "joint": {
                "joint_hidden": size.joint_hidden,
                "activation": "relu",
                "encoder_hidden": size.encoder_width,
                "pred_hidden": size.predictor_hidden,
                "num_classes": RNNT_VOCAB,
            },
            "output_dim": size.llm_hidden,
            "max_symbols": 2,  # real: 10; the random joint would repeat a piece 10 times
        },
        "tts_config": {
            "hidden_size": size.tts_hidden,
            "intermediate_size": size.tts_intermediate,
            "num_hidden_layers": size.tts_layers,
            "num_attention_heads": size.tts_heads,
            "num_key_value_heads": size.tts_kv_heads,
            "head_dim": size.tts_head_dim,
            "sliding_window": 7500,
            "sliding_window_pattern": size.tts_window_pattern,
            "latent_size": size.latent,
            "num_quantizers": 31,
            "codebook_size": size.codebook,
            "character_encoder": {
                "hidden_size": size.tts_hidden,
                "intermediate_size": size.char_intermediate,
                "num_hidden_layers": size.char_layers,
                "num_attention_heads": size.char_heads,
                "num_key_value_heads": size.char_kv_heads,
                "head_dim": size.char_head_dim,
                "char_vocab_size": 257,
            },
            "mog_head": {
                "intermediate_size": size.mog_intermediate,
                "low_rank": size.mog_low_rank,
                "num_layers": size.mog_layers,
                "num_predictions": size.mog_predictions,
            },
        },
        "codec_config": {
            "sample_rate": 22050,
            "base_channels": size.codec_channels,
            "channel_multipliers": list(size.codec_multipliers),
            "downsample_rates": [7, 7, 9],
            "blocks_per_stage": size.codec_blocks,
            "block_kernel_size": 7,
            "latent_dim": size.latent,
            "n_fft": 16,
            "hop_length": 4,
            "num_quantizers": 31,
            "codebook_size": size.codebook,
        },
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "silence_token_id": SILENCE,
        "rnnt_blank_id": RNNT_BLANK,
        "input_sample_rate": 16000,
        "output_sample_rate": 22050,
        "frame_duration": 0.08,
        "function_channel_weight": 2.0,
        "speaker": "Aria",
        "rnnt_vocabulary": rnnt_vocabulary(),
    }
    if quantize is not None:
        quantization = {"group_size": QUANT_GROUP_SIZE, "bits": quantize}
        config["quantization"] = dict(quantization)
        config["quantization_config"] = dict(quantization)
    return config
