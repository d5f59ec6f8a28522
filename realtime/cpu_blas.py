"""Which CBLAS library MLX's CPU backend multiplies with on Linux, chosen before MLX loads.

MLX's Linux CPU wheel (``mlx[cpu]``, 0.32 here) links the netlib *reference* BLAS it
bundles (``mlx_cpu.libs/libblas-*.so.3.10.0``), whose cost per row is the same however
many rows a multiply has, where OpenBLAS's falls with them (docs/performance.md, "MLX's
CPU BLAS"). So on that wheel batching conversations saves no matrix work at all.
``libmlx.so`` calls ``cblas_sgemm`` by name; loading another library that defines it
into the process's global symbol scope *before* MLX is imported makes the dynamic linker
bind MLX to that one instead (ELF symbol interposition; loading it afterwards changes
nothing, the first bind sticks).

``bundled`` (the default) keeps MLX's own: every conversation's output is then bit for
bit its solo run, batched or not. ``openblas`` (a system OpenBLAS, e.g. Debian's
``libopenblas0``) or a path to any library exporting ``cblas_sgemm`` (MKL's
``libmkl_rt.so``, BLIS) is opt-in because an optimised GEMM picks its kernels by the
matrix's shape: at batch 1 the step is still mlx-vlm's bit for bit (same BLAS, same
shapes), but a batched row's float32 samples differ from its solo run's in the last bits
(text, transcript and audio codes stay equal; docs/performance.md has the measured
difference). On macOS MLX runs on Metal and uses Accelerate; only ``bundled`` is
accepted there. Quantized checkpoints multiply in MLX's own kernels, so this matters for
float32 ones.

What this module does is process-wide by nature (one dynamic linker per process), so
its single piece of state, :func:`active`, is too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Callable, Mapping

from attrs import frozen

from realtime.errors import UsageError

log = logging.getLogger(__name__)

CPU_BLAS_ENV = "REALTIME_CPU_BLAS"
BUNDLED = "bundled"
OPENBLAS = "openblas"

# Where distributions put the OpenBLAS runtime when ldconfig does not know it.
_OPENBLAS_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)


@frozen
class BlasChoice:
    """``path`` None: MLX's own bundled BLAS; else the library to load first."""

    name: str
    path: str | None = None

    def describe(self) -> str:
        return self.name if self.path is None else f"{self.name} ({self.path})"


_active = BlasChoice(BUNDLED)


def active() -> BlasChoice:
    """The CBLAS this process's MLX multiplies with (as far as this module chose it)."""
    return _active


def resolve(
    value: str | None,
    *,
    system: str = sys.platform,
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    exists: Callable[[str], bool] = os.path.exists,
) -> BlasChoice:
    """``bundled``/unset/empty, ``openblas`` or a library path, as a choice; a bad one
    is a :class:`UsageError` saying what to do. Looks at the filesystem, loads nothing."""
    text = (value or "").strip()
    if text in ("", BUNDLED):
        return BlasChoice(BUNDLED)
    if not system.startswith("linux"):
        raise UsageError(
            f"--cpu-blas {text}: only on Linux (MLX's Linux CPU wheel bundles a reference "
            "BLAS; elsewhere MLX uses the platform's own); use 'bundled'"
        )
    if text == OPENBLAS:
        found = find_library("openblas")
        candidates = ([found] if found else []) + list(_OPENBLAS_PATHS)
        for candidate in candidates:
            if "/" not in candidate or exists(candidate):
                return BlasChoice(OPENBLAS, candidate)
        raise UsageError(
            "--cpu-blas openblas: no OpenBLAS library found (install the system package, "
            "e.g. 'apt install libopenblas0', or give the library's path)"
        )
    if "/" not in text:
        raise UsageError(
            f"--cpu-blas {text!r}: expected 'bundled', 'openblas' or a path to a CBLAS library"
        )
    if not exists(text):
        raise UsageError(f"--cpu-blas {text}: no such file")
    return BlasChoice("custom", text)


def from_env(environ: Mapping[str, str]) -> str | None:
    return environ.get(CPU_BLAS_ENV) or None


def install(
    choice: BlasChoice,
    *,
    modules: Mapping[str, object] | None = None,
    load: Callable[[str], object] | None = None,
) -> BlasChoice:
    """Load ``choice``'s library into the global symbol scope so MLX binds to it.

    Must run before anything imports ``mlx.core`` (a :class:`UsageError` otherwise,
    since it would silently do nothing); ``bundled`` is a no-op. The library must
    export ``cblas_sgemm``, the one symbol MLX's float32 matmul calls.
    """
    global _active
    if choice.path is None:
        return choice
    loaded = sys.modules if modules is None else modules
    if "mlx.core" in loaded:
        raise UsageError(
            f"--cpu-blas {choice.name}: MLX is already loaded in this process; "
            "the BLAS must be chosen before it is"
        )
    opener = load or (lambda path: ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
    try:
        library = opener(choice.path)
    except OSError as exc:
        raise UsageError(f"--cpu-blas {choice.name}: cannot load {choice.path}: {exc}") from None
    if not hasattr(library, "cblas_sgemm"):
        raise UsageError(
            f"--cpu-blas {choice.name}: {choice.path} does not export cblas_sgemm "
            "(not a CBLAS library)"
        )
    _active = choice
    log.info("MLX's CPU matmuls use %s", choice.describe())
    return choice


def install_from(value: str | None) -> BlasChoice:
    """The flag's or the environment's value, resolved and installed: one call per
    command, before the model loads."""
    return install(resolve(value))
