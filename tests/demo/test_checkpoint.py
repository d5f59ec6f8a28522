"""The demo checkpoint: real layout, deterministic bytes, loads through mlx-vlm."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from realtime.demo.checkpoint import (
    BUILDER_VERSION,
    MARKER_FILE,
    demo_checkpoint_is_complete,
    ensure_demo_checkpoint,
    install_atomically,
    write_demo_checkpoint,
)
from realtime.models import check_model_path, load_model
from realtime.models.base import (
    AssistantTextDelta,
    FunctionDelta,
    UserTranscriptDelta,
    open_session,
)
from realtime.models.voicechat.model import VoiceChatModel
from tests.models_fixtures import noise, push_all, run_realtime, speechlike


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.is_file()}


def test_demo_model_is_deterministic(demo_path: Path, tmp_path: Path) -> None:
    again = write_demo_checkpoint(tmp_path / "again")
    first, second = _files(demo_path), _files(again)
    assert sorted(first) == sorted(second)
    for name in first:
        assert first[name] == second[name], name


def test_demo_model_layout(demo_path: Path) -> None:
    info = check_model_path(demo_path)
    assert info.model_type == "nemotron_voicechat"
    assert info.model_id == "realtime-demo-voicechat"
    assert len(info.shards) >= 2
    config = json.loads((demo_path / "config.json").read_text())
    assert "quantization" not in config
    index = json.loads((demo_path / "model.safetensors.index.json").read_text())
    keys = set(index["weight_map"])
    # NeMo names and PyTorch layouts, as in the real uploads.
    assert "tts_model._control_codes" in keys
    assert any(".dec_rnn.lstm.weight_ih_l0" in k for k in keys)
    assert any(".dec_rnn.lstm.bias_hh_l1" in k for k in keys)
    assert any("prvq._variance_list." in k for k in keys)
    assert not any(k.endswith((".Wx", ".Wh")) for k in keys)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (demo_path / name).is_file()
    marker = json.loads((demo_path / MARKER_FILE).read_text())
    assert marker["builder_version"] == BUILDER_VERSION


def test_demo_model_loads_through_mlx_vlm(demo_path: Path) -> None:
    from mlx.nn.layers.quantized import QuantizedLinear
    from mlx_vlm.utils import load

    model, processor = load(str(demo_path), lazy=True, strict=True, trust_remote_code=False)
    tokenizer: Any = getattr(processor, "tokenizer", processor)
    assert len(tokenizer.get_vocab()) == 512
    assert model.config.model_type == "nemotron_voicechat"
    assert not isinstance(model.stt_model.lm_head, QuantizedLinear)
    runtime = model.create_session(processor)
    session = runtime.create_streaming_session(seed=0)
    events = session.push_audio(noise(2), sample_rate=16000)
    audio = [e for e in events if e.kind == "audio"]
    assert len(audio) == 2 and audio[0].samples.shape == (1764,)


@pytest.mark.parametrize("bits", [4, 8])
def test_demo_model_quantized_loads(bits: int, tmp_path: Path, demo_path_4bit: Path) -> None:
    from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear

    path = demo_path_4bit if bits == 4 else write_demo_checkpoint(tmp_path / "q", quantize=bits)
    config = json.loads((path / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": bits}
    model = load_model(path)
    assert isinstance(model, VoiceChatModel)
    stt = model.runtime.model.stt_model
    assert isinstance(stt.lm_head, QuantizedLinear) and stt.lm_head.bits == bits
    assert isinstance(stt.function_head, QuantizedLinear)
    assert isinstance(stt.embed_tokens, QuantizedEmbedding)
    assert isinstance(stt.llm.layers[2].mixer.up_proj, QuantizedLinear)
    # Perception, RNN-T and TTS stay unquantized, as in the real uploads.
    assert not isinstance(stt.perception.proj, QuantizedLinear)
    assert not isinstance(stt.rnnt_joint.enc, QuantizedLinear)
    session = open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
    events = push_all(session, noise(3))
    assert sum(1 for e in events if type(e).__name__ == "AudioDelta") == 3


def test_demo_text_is_sparse_but_present(demo_model: VoiceChatModel) -> None:
    """Noise and speech-like input show text and transcript within 50 frames, not every frame."""
    for samples in (noise(50), speechlike(50)):
        session = open_session(demo_model, system_prompt=None, seed=0, max_streaming_seconds=None)
        events = push_all(session, samples)
        text = [e for e in events if isinstance(e, AssistantTextDelta)]
        transcript = [e for e in events if isinstance(e, UserTranscriptDelta)]
        assert text and transcript
        assert len({e.frame_index for e in text}) < 50
    session = open_session(demo_model, system_prompt=None, seed=0, max_streaming_seconds=None)
    events = push_all(session, np.zeros(50 * 1280, dtype=np.float32))
    assert not [e for e in events if isinstance(e, (AssistantTextDelta, FunctionDelta))]


def test_ensure_demo_checkpoint_caches_and_rebuilds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REALTIME_CACHE_DIR", str(tmp_path))
    path = ensure_demo_checkpoint()
    assert path.name == "realtime-demo-voicechat"
    assert path.is_relative_to(tmp_path)
    assert demo_checkpoint_is_complete(path)
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_demo_checkpoint() == path
    assert (path / "config.json").stat().st_mtime_ns == stamp  # not rebuilt
    shard = next(path.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:100])  # an interrupted copy
    assert not demo_checkpoint_is_complete(path)
    assert ensure_demo_checkpoint() == path
    assert demo_checkpoint_is_complete(path)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".realtime-demo")]


def test_demo_model_command(tmp_path: Path, demo_cache_dir: Path) -> None:
    target = tmp_path / "out" / "my-demo"
    run = run_realtime(demo_cache_dir, "demo-model", str(target), "--quantize", "8")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(target.resolve())
    assert check_model_path(target).quantization_bits == 8
    # Rewriting a demo checkpoint is fine; a foreign non-empty folder is refused.
    run = run_realtime(demo_cache_dir, "demo-model", str(target))
    assert run.returncode == 0, run.stderr
    assert check_model_path(target).quantization_bits is None
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    run = run_realtime(demo_cache_dir, "demo-model", str(foreign))
    assert run.returncode == 2
    assert "not a demo checkpoint" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    assert (foreign / "notes.txt").read_text() == "mine"


def test_install_atomically_replaces_or_leaves_the_target(tmp_path: Path) -> None:
    target = tmp_path / "folder"

    def build(text: str) -> Callable[[Path], None]:
        def write(staging: Path) -> None:
            (staging / "file.txt").write_text(text)

        return write

    assert install_atomically(target, build("one")) == target
    assert (target / "file.txt").read_text() == "one"
    install_atomically(target, build("two"))
    assert (target / "file.txt").read_text() == "two"

    def fail(staging: Path) -> None:
        (staging / "half.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        install_atomically(target, fail)
    assert sorted(p.name for p in target.iterdir()) == ["file.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder"]


def test_full_preset_has_the_real_models_dimensions() -> None:
    """``--size full`` is the real 11 B model's shape: the VoiceChat thinker config
    (Nemotron Nano 9B v2) and mlx-vlm's and mlx-audio's defaults, which are the real
    model's. Read lazily: no weight is computed."""
    from mlx_audio.codec.models.nemotron_voicechat import NemotronVoiceChatCodecConfig
    from mlx_audio.stt.models.nemotron_asr.config import ConformerArgs, JointArgs, PredictArgs
    from mlx_vlm.models.nemotron_voicechat.config import (
        CharacterEncoderConfig,
        MoGConfig,
        TTSConfig,
    )

    from realtime.demo.checkpoint import FULL
    from realtime.demo.checkpoint.config import demo_config
    from realtime.demo.checkpoint.weights import parameter_templates

    config = demo_config(4, FULL)
    text = config["text_config"]
    assert (text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]) == (
        4480,
        56,
        131072,
    )
    pattern = text["hybrid_override_pattern"]
    assert (pattern.count("M"), pattern.count("-"), pattern.count("*")) == (27, 25, 4)
    assert (text["mamba_num_heads"], text["mamba_head_dim"], text["n_groups"]) == (128, 80, 8)
    encoder, conformer = config["audio_config"]["encoder"], ConformerArgs()
    for key in ("n_layers", "d_model", "n_heads", "ff_expansion_factor"):
        assert encoder[key] == getattr(conformer, key), key
    assert encoder["subsampling_conv_channels"] == conformer.subsampling_conv_channels
    assert config["audio_config"]["decoder"]["pred_hidden"] == PredictArgs().pred_hidden
    assert config["audio_config"]["joint"]["joint_hidden"] == JointArgs().joint_hidden
    for section, defaults in (
        (config["tts_config"], TTSConfig()),
        (config["tts_config"]["character_encoder"], CharacterEncoderConfig()),
        (config["tts_config"]["mog_head"], MoGConfig()),
        (config["codec_config"], NemotronVoiceChatCodecConfig()),
    ):
        for key, value in section.items():
            if isinstance(value, (int, float, str, list)) and hasattr(defaults, key):
                expected = getattr(defaults, key)
                assert value == (list(expected) if isinstance(expected, tuple) else expected), key
    templates = parameter_templates(config)
    parameters = sum(int(np.prod(t.shape)) for t in templates.values())
    assert 11.0e9 < parameters < 11.2e9  # the real checkpoints: 11.1 B


def test_deep_preset_has_the_real_models_structure_with_tiny_widths(
    tmp_path: Path, demo_cache_dir: Path
) -> None:
    """``--size deep`` keeps every layer count, the layer pattern, the head counts and
    groupings, the TTS window pattern and the real upload's storage (4-bit language model
    unless ``--quantize`` says otherwise, bfloat16 rest) of ``full``, with tiny's widths."""
    from realtime.demo.checkpoint import DEEP, FULL, SMALL

    structure = (
        "llm_pattern",
        "llm_heads",
        "llm_kv_heads",
        "mamba_groups",
        "encoder_layers",
        "encoder_heads",
        "encoder_ff_factor",
        "predictor_layers",
        "tts_layers",
        "tts_heads",
        "tts_kv_heads",
        "tts_window_pattern",
        "char_layers",
        "char_heads",
        "char_kv_heads",
        "mog_layers",
        "codec_blocks",
        "codec_multipliers",
        "weight_dtype",
    )
    for field in structure:
        assert getattr(DEEP, field) == getattr(FULL, field), field
    assert (DEEP.llm_hidden, DEEP.tts_hidden, DEEP.vocab) == (
        SMALL.llm_hidden,
        SMALL.tts_hidden,
        SMALL.vocab,
    )
    assert DEEP.quantize == 4
    target = tmp_path / "deep"
    run = run_realtime(demo_cache_dir, "demo-model", str(target), "--size", "deep")
    assert run.returncode == 0, run.stderr
    assert check_model_path(target).quantization_bits == 4
    assert demo_checkpoint_is_complete(target, 4, DEEP)
    config = json.loads((target / "config.json").read_text())
    assert config["text_config"]["num_hidden_layers"] == 56
    assert sum(p.stat().st_size for p in target.iterdir()) < 16 * 1024**2


def test_a_preset_stores_bfloat16_weights_and_extra_vocabulary_rows(tmp_path: Path) -> None:
    """What ``full`` changes beside its dimensions, on tiny dimensions: the unquantized
    tensors in bfloat16 (as the real uploads), vocabulary rows past the tokenizer's that
    are never chosen, grouped Mamba, more codec blocks, a larger codebook, a joint
    narrower than the encoder. It loads through mlx-vlm and runs, 4-bit too."""
    import attrs
    from mlx.nn.layers.quantized import QuantizedLinear
    from mlx.utils import tree_flatten

    from realtime.demo.checkpoint import SMALL

    size = attrs.evolve(
        SMALL,
        name="shape-check",
        weight_dtype="bfloat16",
        vocab=1024,
        mamba_heads=4,
        mamba_groups=2,
        codec_blocks=2,
        codebook=256,
        mog_predictions=32,
        tts_layers=3,
        tts_window_pattern=3,
        joint_hidden=24,  # narrower than the encoder, as the real joint (640 < 1024)
    )
    for bits in (None, 4):
        path = write_demo_checkpoint(tmp_path / f"q{bits}", quantize=bits, size=size)
        assert demo_checkpoint_is_complete(path, bits, size)
        model = load_model(path)
        assert isinstance(model, VoiceChatModel)
        stt = model.runtime.model.stt_model
        # Stored bfloat16: the codec keeps it; the perception meets float32 and is cast
        # to it once at load (realtime/models/voicechat/cast.py).
        codec = cast(
            "list[tuple[str, Any]]",
            tree_flatten(model.runtime.model.tts_model.audio_codec.parameters()),
        )
        assert {value.dtype.size for _, value in codec} == {2}
        assert stt.perception.proj.weight.dtype.size == 4
        assert isinstance(stt.lm_head, QuantizedLinear) == (bits == 4)
        session = open_session(model, system_prompt=None, seed=0, max_streaming_seconds=None)
        events = push_all(session, speechlike(40))
        assert sum(1 for e in events if type(e).__name__ == "AudioDelta") == 40
        chosen = [e.token_id for e in events if isinstance(e, (AssistantTextDelta, FunctionDelta))]
        assert chosen and max(chosen) < 512  # the tokenizer's tokens only


def test_shards_are_cut_at_their_size_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, demo_path: Path
) -> None:
    """A checkpoint is written a shard at a time, each cut before it would pass the
    limit; the same tensors, indexed, load as before."""
    from safetensors import safe_open

    from realtime.demo.checkpoint import files

    monkeypatch.setattr(files, "SHARD_BYTES", 256 * 1024)
    path = write_demo_checkpoint(tmp_path / "sharded")
    shards = sorted(path.glob("model-*.safetensors"))
    assert len(shards) > 4
    assert all(s.name.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    tensors: dict[str, Any] = {}
    for shard in shards:
        with safe_open(str(shard), framework="numpy") as file:
            names = list(file.keys())
            if len(names) > 1:
                assert shard.stat().st_size <= 256 * 1024 + 64 * 1024  # header and one tensor
            tensors.update({name: file.get_tensor(name) for name in names})
            assert {index["weight_map"][name] for name in names} == {shard.name}
    reference: dict[str, Any] = {}
    for shard in sorted(demo_path.glob("model-*.safetensors")):
        with safe_open(str(shard), framework="numpy") as file:
            reference.update({name: file.get_tensor(name) for name in file.keys()})  # noqa: SIM118
    assert sorted(tensors) == sorted(reference)
    assert all(np.array_equal(tensors[name], reference[name]) for name in reference)
    assert isinstance(load_model(path), VoiceChatModel)


def test_bfloat16_rounds_to_nearest_even_as_mlx_does() -> None:
    import mlx.core as mx

    from realtime.demo.checkpoint.files import _bfloat16_bits

    gen = np.random.default_rng(0)
    values = np.concatenate(
        [
            gen.standard_normal(10000).astype(np.float32),
            # exactly halfway between two bfloat16 values, both parities
            np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 0.0, -0.0], np.float32),
        ]
    )
    ours = _bfloat16_bits(values)
    theirs = np.array(mx.array(values).astype(mx.bfloat16).view(mx.uint16))
    assert np.array_equal(ours, theirs)
    scalar = _bfloat16_bits(np.array(1.5, np.float32))  # a 0-d tensor stays one
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and int(scalar) == 0x3FC0
