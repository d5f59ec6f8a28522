"""The inverse of mlx-vlm's ``Model.sanitize``: NeMo names and PyTorch layouts.

Writing what the real uploads hold (not what mlx-vlm keeps in memory) means the
demo exercises the loader's own conversion on every load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime.demo.checkpoint.weights import Array, rng


def contiguous(value: Array) -> Array:
    """``value`` in C order, copied only when it is not (a transposed view); unlike
    ``np.ascontiguousarray`` it keeps 0-d scalars 0-d."""
    return value if value.flags.c_contiguous else np.array(value, order="C")


def _codec_stage_start(name: str, config: dict[str, Any]) -> bool:
    """Whether a codec decoder layer is a ConvTranspose1d (stored (in, out, k))."""
    codec = config["codec_config"]
    index = int(name.split(".")[4])
    width = int(codec["blocks_per_stage"]) + 1
    stages = len(codec["downsample_rates"])
    return index < width * stages and index % width == 0


def _lstm_tensors(name: str, value: Array) -> list[tuple[str, Array]]:
    """An mlx-vlm LSTM parameter under PyTorch's names; its one bias becomes two."""
    stem, layer, kind = name.rsplit(".", 2)
    if kind == "Wx":
        return [(f"{stem}.weight_ih_l{layer}", value)]
    if kind == "Wh":
        return [(f"{stem}.weight_hh_l{layer}", value)]
    # PyTorch keeps two biases that the loader sums.
    half = rng(name + ".split").standard_normal(value.shape, dtype=np.float32)
    half = (half * np.float32(0.02)).astype(np.float32)
    return [
        (f"{stem}.bias_ih_l{layer}", half),
        (f"{stem}.bias_hh_l{layer}", (value - half).astype(np.float32)),
    ]


def _codec_tensor(name: str, value: Array, config: dict[str, Any]) -> tuple[str, Array]:
    """An audio codec parameter: NeMo's variance-list name, convolutions (out, in, k)
    except the decoder's ConvTranspose1d stage starts (in, out, k)."""
    key = name.replace("prvq.variance_list.", "prvq._variance_list.")
    if name.endswith(".weight") and value.ndim == 3:
        if name.startswith("tts_model.audio_codec.decoder.layers.") and (
            "dwconv" not in name and _codec_stage_start(name, config)
        ):
            value = value.transpose(2, 0, 1)
        else:
            value = value.transpose(0, 2, 1)
    return key, contiguous(value)


def checkpoint_tensors(name: str, value: Array, config: dict[str, Any]) -> list[tuple[str, Array]]:
    """One mlx-vlm parameter as a NeMo-exported checkpoint stores it (a name and a
    layout; an LSTM bias becomes the two PyTorch keeps)."""
    if ".dec_rnn.lstm." in name:
        return _lstm_tensors(name, value)
    if name == "tts_model.control_codes":
        return [("tts_model._control_codes", value)]
    if name.startswith("tts_model.audio_codec."):
        return [_codec_tensor(name, value, config)]
    if name.startswith("stt_model.perception.") and value.ndim == 4:
        value = value.transpose(0, 3, 1, 2)
    elif value.ndim == 3 and (
        name.startswith("stt_model.perception.")
        or (name.startswith("stt_model.llm.") and name.endswith(".conv1d.weight"))
    ):
        value = value.transpose(0, 2, 1)
    return [(name, contiguous(value))]


def front_end_buffers() -> list[tuple[str, Array]]:
    """The mel front end's buffers, which NeMo stores too (the loader rebuilds and
    drops them)."""
    window = np.hanning(402)[1:-1].astype(np.float32)
    return [
        ("stt_model.perception.preprocessor.featurizer.window", window),
        ("stt_model.perception.preprocessor.featurizer.fb", np.zeros((1, 128, 257), np.float32)),
    ]
