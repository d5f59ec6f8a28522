"""Models the server can drive, behind the seam in :mod:`realtime.models.base`.

``check_model_path`` is cheap and MLX-free (the CLI runs it before anything
starts); ``load_model`` does the real work and belongs on the engine thread.
"""

from __future__ import annotations

import logging
import os

from realtime.models.base import RealtimeModel
from realtime.models.checkpoint import (
    SUPPORTED_MODEL_TYPES,
    CheckpointInfo,
    ModelLoadError,
    ModelPathError,
    check_model_path,
    model_id_for,
    one_line,
)
from realtime.models.prompt_cache import STEP_READ, PrefillRead

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CheckpointInfo",
    "ModelLoadError",
    "ModelPathError",
    "check_model_path",
    "load_model",
    "model_id_for",
]

log = logging.getLogger(__name__)


def load_model(path: str | os.PathLike[str], *, prefill: PrefillRead = STEP_READ) -> RealtimeModel:
    """Check, detect and load a checkpoint folder (``prefill``: how its openings read
    their system prompts, ``--prefill``). Run it on the engine thread.

    Raises ModelPathError for a folder that is not a usable checkpoint and
    ModelLoadError (one line, with the library's message) when loading fails.
    """
    info = check_model_path(path)
    if info.model_type == "nemotron_voicechat":
        from realtime.models.voicechat.load import load_voicechat

        try:
            return load_voicechat(info.path, info=info, prefill=prefill)
        except ModelLoadError:
            raise
        except Exception as exc:
            log.debug("loading %s failed", info.path, exc_info=True)
            raise ModelLoadError(
                f"loading {info.model_id} failed: {type(exc).__name__}: {one_line(str(exc))}"
            ) from exc
    raise ModelPathError(f"unsupported model_type {info.model_type!r}")  # pragma: no cover
