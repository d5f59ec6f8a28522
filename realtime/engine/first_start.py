"""What the engine says before it compiles the model step at start.

MLX's CPU backend builds each kernel ``mx.compile`` fuses with the system's C++
compiler, once per machine and MLX version, and keeps the shared libraries under
``std::filesystem::temp_directory_path() / "mlx" / VERSION / "cpu"``
(``mlx/backend/cpu/compiled.cpp``). So the first start on a machine waits for the
compiler (measured for the demo checkpoint: 25 s on a quiet 2-core VM, 48 and 56 s
with that VM loaded by other jobs; 24 kernels), and every later start loads the cached
ones (0.05 s). Nothing was
printed while it waited; this line says what happens, how long, and where it goes.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Final

FIRST_START: Final = "about 25 s on a quiet 2-core CPU for the demo checkpoint"
"""The first start's compile, as measured (README's quick start says it too)."""


def kernel_cache(environ: Mapping[str, str] | None = None, version: str | None = None) -> Path:
    """Where MLX's CPU backend caches its compiled kernels: libstdc++'s temporary
    directory (``TMPDIR``, ``TMP``, ``TEMP`` or ``TEMPDIR``, else ``/tmp``), then
    ``mlx/VERSION/cpu``. Read without importing MLX (the engine may not)."""
    env = os.environ if environ is None else environ
    root = next(
        (env[name] for name in ("TMPDIR", "TMP", "TEMP", "TEMPDIR") if env.get(name)), "/tmp"
    )
    if version is None:
        try:
            version = importlib.metadata.version("mlx")
        except importlib.metadata.PackageNotFoundError:
            version = "VERSION"
    return Path(root) / "mlx" / version / "cpu"


def on_gpu() -> bool:
    """Whether MLX, once a model loaded it, runs on a GPU (where the kernels are not
    the CPU backend's); never imports MLX itself."""
    mx = sys.modules.get("mlx.core")
    if mx is None:
        return False
    try:
        return "gpu" in str(mx.default_device())
    except Exception:  # a broken or foreign build: say nothing about it
        return False


def compile_off(environ: Mapping[str, str] | None = None) -> bool:
    """Whether MLX's own switch turns ``mx.compile`` off (``realtime --no-compile``
    sets it too)."""
    env = os.environ if environ is None else environ
    return env.get("MLX_DISABLE_COMPILE", "").lower() not in ("", "0", "false")


def compile_note(batch_sizes: int, cache: Path, *, gpu: bool = False, off: bool = False) -> str:
    """The line logged before the step is compiled for ``batch_sizes`` sizes. On the
    CPU, a first start (no kernel in ``cache``) says how long it takes and where the
    result goes; a later one, that it reuses what is there."""
    what = f"compiling the model step for {batch_sizes} batch size(s)"
    if off:
        return (
            f"tracing the model step for {batch_sizes} batch size(s) with compiling off "
            "(--no-compile or MLX_DISABLE_COMPILE): no kernel is built, the pieces run "
            "op by op"
        )
    if gpu:
        return f"{what} on the GPU (--no-compile skips it)"
    try:
        cached = sum(1 for path in cache.iterdir() if path.suffix == ".so")
    except OSError:
        cached = 0
    if not cached:
        return (
            f"{what}: a first start on this machine builds MLX's CPU kernels with the C++ "
            f"compiler ({FIRST_START}, longer on a busy machine; "
            f"--no-compile skips it) and caches them in {cache}, so later starts take "
            "well under a second"
        )
    return (
        f"{what}, reusing the {cached} kernel(s) MLX's CPU backend cached in {cache} "
        "(a kernel not there yet is built with the C++ compiler, about a second each)"
    )


def start_note(batch_sizes: int) -> str:
    """:func:`compile_note` for this process: its kernel cache, its device."""
    return compile_note(batch_sizes, kernel_cache(), gpu=on_gpu(), off=compile_off())
