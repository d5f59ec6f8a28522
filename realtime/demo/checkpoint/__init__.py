"""A tiny random-weight VoiceChat checkpoint in the real on-disk layout.

It lets the server, the clients and the tests run end to end with no download:
the files look like a real ``mlx-community/NemotronLabs-VoiceChat-11B-*`` folder
(NeMo parameter names, PyTorch tensor layouts, sharded safetensors plus an index,
a Hugging Face tokenizer) and load through the unmodified ``mlx_vlm.load``.
It builds a checkpoint; it is not a model, so it sits beside ``realtime.models``.

Modules, lowest first: ``config`` (dimensions and ``config.json``), ``tokenizer``,
``weights`` (random, biased), ``layout`` (mlx-vlm's conversion run backwards),
``quantize``, ``files`` (the folder and its marker), ``install`` (atomic
replace), ``cache`` (the shared per-user copy).
"""

from __future__ import annotations

from realtime.demo.checkpoint.cache import ensure_demo_checkpoint
from realtime.demo.checkpoint.config import DEEP, FULL, MEDIUM, SIZES, SMALL, DemoSize, demo_name
from realtime.demo.checkpoint.files import (
    BUILDER_VERSION,
    MARKER_FILE,
    demo_checkpoint_is_complete,
    is_demo_checkpoint,
    write_demo_checkpoint,
)
from realtime.demo.checkpoint.install import install_atomically
from realtime.models.state_files import cache_root

__all__ = [
    "BUILDER_VERSION",
    "DEEP",
    "FULL",
    "MARKER_FILE",
    "MEDIUM",
    "SIZES",
    "SMALL",
    "DemoSize",
    "cache_root",
    "demo_checkpoint_is_complete",
    "demo_name",
    "ensure_demo_checkpoint",
    "install_atomically",
    "is_demo_checkpoint",
    "write_demo_checkpoint",
]
