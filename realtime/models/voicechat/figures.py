"""A VoiceChat checkpoint's figures (rates, frame sizes, codebooks, token ids), read from
mlx-vlm's ``ModelConfig``: at load, and without loading for tools that must know them
ahead."""

from __future__ import annotations

import json
import os
from typing import Any

import attrs
from mlx_vlm.models.nemotron_voicechat.config import ModelConfig

from realtime.models.base import VOICECHAT_FIGURES, ModelFigures
from realtime.models.checkpoint import ModelLoadError, check_model_path, one_line


def figures_of(config: Any) -> ModelFigures:
    """The figures of a checkpoint, from mlx-vlm's ``ModelConfig`` (``model.config``).

    The rates are the config's ``input_sample_rate`` and ``output_sample_rate``; a
    frame is ``round(input_sample_rate * frame_duration)`` samples, as mlx-vlm's
    streaming session cuts its input; an output frame is the codec's
    ``waveform_to_token_ratio`` (``hop_length`` times the ``downsample_rates``,
    4 x 7 x 7 x 9 = 1764); the codebooks are the TTS's ``num_quantizers``; the token
    ids are the config's. The tool-call markers are the trained format's (no config
    holds them). ValueError when parts of the config disagree (the mel front end's or
    the codec's rate, the codec's and the TTS's codebooks) or a figure is unusable.
    """
    codec, tts = config.codec_config, config.tts_config
    mel_rate = config.audio_config.preprocessor.sample_rate
    if mel_rate != config.input_sample_rate:
        raise ValueError(
            f"the mel front end expects {mel_rate} Hz but input_sample_rate is "
            f"{config.input_sample_rate}"
        )
    if codec.sample_rate != config.output_sample_rate:
        raise ValueError(
            f"the codec speaks {codec.sample_rate} Hz but output_sample_rate is "
            f"{config.output_sample_rate}"
        )
    if codec.num_quantizers != tts.num_quantizers:
        raise ValueError(
            f"the codec has {codec.num_quantizers} codebooks, the TTS {tts.num_quantizers}"
        )
    return attrs.evolve(
        VOICECHAT_FIGURES,
        input_sample_rate=config.input_sample_rate,
        output_sample_rate=config.output_sample_rate,
        frame_samples=round(config.input_sample_rate * float(config.frame_duration)),
        output_frame_samples=codec.waveform_to_token_ratio,
        codebooks=tts.num_quantizers,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        silence_token_id=config.silence_token_id,
    )


def checkpoint_figures(path: str | os.PathLike[str]) -> ModelFigures:
    """A checkpoint folder's figures from its ``config.json`` as mlx-vlm reads it
    (its defaults included), without loading any weight: for tools that must know
    them before a server or a model is up (the benchmarks encode audio ahead)."""

    info = check_model_path(path)
    config = json.loads((info.path / "config.json").read_text("utf-8"))
    return loaded_figures(ModelConfig.from_dict(config), info.model_id)


def loaded_figures(config: Any, model_id: str) -> ModelFigures:
    try:
        return figures_of(config)
    except ValueError as exc:
        raise ModelLoadError(f"{model_id} has unusable figures: {one_line(str(exc))}") from None
