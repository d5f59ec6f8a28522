"""The demo checkpoint in the user's cache folder, built once and shared by processes."""

from __future__ import annotations

import logging
from pathlib import Path

from realtime.demo.checkpoint.config import SMALL, DemoSize, demo_name
from realtime.demo.checkpoint.files import (
    BUILDER_VERSION,
    demo_checkpoint_is_complete,
    write_demo_checkpoint,
)
from realtime.demo.checkpoint.install import install_atomically
from realtime.models.state_files import cache_root

log = logging.getLogger(__name__)


def ensure_demo_checkpoint(quantize: int | None = None, size: DemoSize = SMALL) -> Path:
    """The cached demo checkpoint of ``size``, built once (atomically) when missing or stale.

    A lock file serialises builders across processes (a server and a test run
    may both start on an empty cache); the loser finds the winner's copy.
    """
    from filelock import FileLock

    root = cache_root() / "demo-models" / f"v{BUILDER_VERSION}"
    target = root / demo_name(quantize, size)
    if demo_checkpoint_is_complete(target, quantize, size):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(root / ".lock"):
        if demo_checkpoint_is_complete(target, quantize, size):
            return target
        log.info("building the %s demo checkpoint into %s", size.name, target)
        install_atomically(target, lambda staging: write_demo_checkpoint(staging, quantize, size))
    return target
