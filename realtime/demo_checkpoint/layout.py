"""The inverse of mlx-vlm's ``Model.sanitize``: NeMo names and PyTorch layouts.

Writing what the real uploads hold (not what mlx-vlm keeps in memory) means the
demo exercises the loader's own conversion on every load.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from realtime.demo_checkpoint.weights import Array, rng


def contiguous(value: Array) -> Array:
    """A C-ordered copy; unlike ``np.ascontiguousarray`` it keeps 0-d scalars 0-d."""
    return np.array(value, order="C", copy=True)


def _codec_stage_start(name: str, config: dict[str, Any]) -> bool:
    """Whether a codec decoder layer is a ConvTranspose1d (stored (in, out, k))."""
    codec = config["codec_config"]
    index = int(name.split(".")[4])
    width = int(codec["blocks_per_stage"]) + 1
    stages = len(codec["downsample_rates"])
    return index < width * stages and index % width == 0


def to_checkpoint_layout(weights: dict[str, Array], config: dict[str, Any]) -> dict[str, Array]:
    """The tensors as a NeMo-exported checkpoint stores them."""
    out: dict[str, Array] = {}
    for name, value in weights.items():
        if ".dec_rnn.lstm." in name:
            stem, layer, kind = name.rsplit(".", 2)
            if kind == "Wx":
                out[f"{stem}.weight_ih_l{layer}"] = value
            elif kind == "Wh":
                out[f"{stem}.weight_hh_l{layer}"] = value
            else:  # PyTorch keeps two biases that the loader sums.
                half = rng(name + ".split").standard_normal(value.shape, dtype=np.float32)
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
            out[key] = contiguous(value)
            continue
        if name.startswith("stt_model.perception.") and value.ndim == 4:
            value = value.transpose(0, 3, 1, 2)
        elif value.ndim == 3 and (
            name.startswith("stt_model.perception.")
            or (name.startswith("stt_model.llm.") and name.endswith(".conv1d.weight"))
        ):
            value = value.transpose(0, 2, 1)
        out[name] = contiguous(value)
    # NeMo also stores the mel front end's buffers; the loader rebuilds and drops them.
    window = np.hanning(402)[1:-1].astype(np.float32)
    out["stt_model.perception.preprocessor.featurizer.window"] = window
    out["stt_model.perception.preprocessor.featurizer.fb"] = np.zeros((1, 128, 257), np.float32)
    return out
