"""Loading a VoiceChat checkpoint with mlx-vlm: the weights read in with progress, cast
and fused once, handed to :class:`~realtime.models.voicechat.model.VoiceChatModel`."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_vlm.utils import load as mlx_vlm_load

from realtime.models.checkpoint import CheckpointInfo, check_model_path
from realtime.models.prompt_cache import STEP_READ, PrefillRead
from realtime.models.voicechat.cast import cast_once
from realtime.models.voicechat.figures import loaded_figures
from realtime.models.voicechat.fused import fuse
from realtime.models.voicechat.model import VoiceChatModel

log = logging.getLogger(__name__)

# Materialise weights in about this many steps so a long load shows progress.
_LOAD_PROGRESS_STEPS = 10
_LOAD_PROGRESS_MIN_BYTES = 1 << 30
"""Smaller checkpoints load in well under a second: their progress lines go to debug."""


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _materialize(model: Any, started: float) -> None:
    """Read the lazily mapped weights in, logging progress by bytes."""

    flat = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    params = [value for _, value in flat]
    total = sum(int(p.nbytes) for p in params) or 1
    step = max(total // _LOAD_PROGRESS_STEPS, 1)
    progress = log.info if total >= _LOAD_PROGRESS_MIN_BYTES else log.debug
    group: list[Any] = []
    done = group_bytes = 0
    for value in params:
        group.append(value)
        group_bytes += int(value.nbytes)
        if group_bytes >= step:
            mx.eval(*group)
            done += group_bytes
            group, group_bytes = [], 0
            progress(
                "weights %3d%% (%s of %s in memory) after %.1f s",
                min(100, 100 * done // total),
                _gb(done),
                _gb(total),
                time.perf_counter() - started,
            )
    if group:
        mx.eval(*group)
        done += group_bytes
        progress(
            "weights 100%% (%s in memory) after %.1f s", _gb(done), time.perf_counter() - started
        )


def _describe(info: CheckpointInfo) -> str:
    kind = f"{info.quantization_bits}-bit LLM" if info.quantization_bits else "unquantized"
    try:
        index = json.loads((info.path / "model.safetensors.index.json").read_text("utf-8"))
        tensors = len(index.get("weight_map", {}))
    except (OSError, ValueError):
        tensors = 0
    shards = len(info.shards)
    return (
        f"{shards} shard{'s' if shards != 1 else ''}, {_gb(info.total_bytes)}"
        + (f", {tensors} tensors" if tensors else "")
        + f", {kind}"
    )


def load_voicechat(
    path: str | os.PathLike[str],
    *,
    info: CheckpointInfo | None = None,
    cast_weights: bool = True,
    prefill: PrefillRead = STEP_READ,
) -> VoiceChatModel:
    """Load a VoiceChat checkpoint folder with mlx-vlm. Run it on the engine thread.

    No text warm-up is run: the first session's prefill warms what it needs. With
    ``cast_weights`` (the default), the weights that only meet float32 are cast to it
    once here (:mod:`realtime.models.voicechat.cast`; the same bits, fewer casts a frame),
    and their norms and rotary embeddings compiled for frame steps
    (:mod:`realtime.models.voicechat.fused`; the same bits, fewer kernels a frame).
    ``prefill`` says how openings read their prompts (``--prefill``).
    """

    info = info or check_model_path(path)
    started = time.perf_counter()
    log.info("loading %s from %s (%s)", info.model_id, info.path, _describe(info))
    model, processor = mlx_vlm_load(str(info.path), lazy=True, strict=True, trust_remote_code=False)
    log.info("model graph built and weights mapped in %.1f s", time.perf_counter() - started)
    figures = loaded_figures(model.config, info.model_id)  # before reading the weights in
    log.debug("%s: %s", info.model_id, figures)
    _materialize(model, started)
    if cast_weights:
        grown = cast_once(model)
        log.info("cast once at load to the float32 they meet: %s more in memory", _gb(grown))
        log.debug("%d norms and rotary embeddings compiled for frame steps", fuse(model))
    runtime = model.create_session(processor)
    log.info("loaded %s in %.1f s", info.model_id, time.perf_counter() - started)
    if prefill.sequence:
        log.info("system prompts are read in sequence: %s", prefill.describe())
        from realtime import cpu_blas

        if str(mx.default_device()).startswith("Device(cpu") and cpu_blas.active().path is None:
            log.warning(
                "--prefill sequence saves nothing on MLX's bundled reference BLAS (its cost "
                "a row is the same however many rows a multiply has) and makes each slice "
                "longer: add --cpu-blas openblas, or keep --prefill step"
            )
    return VoiceChatModel(runtime, info.path, figures, cast=cast_weights, prefill=prefill)
