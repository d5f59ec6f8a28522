"""Putting a freshly built folder in place so that no reader sees half of it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def install_atomically(target: Path, build: Callable[[Path], object]) -> Path:
    """Run ``build`` on a new folder beside ``target``, then rename it to ``target``.

    The staging folder sits in the same parent so the renames never cross file
    systems. An older ``target`` is renamed away first and deleted; when ``build``
    fails, ``target`` is left as it was and the staging folder is removed.
    """
    parent = target.parent
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        build(staging)
        if target.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=parent))
            os.replace(target, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
