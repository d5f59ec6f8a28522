"""``--cpu-blas``: which CBLAS MLX's Linux CPU backend multiplies with (realtime/cpu_blas.py).

The choice is a pure function of the flag and the filesystem; installing it refuses
once MLX is loaded (it would do nothing) and a library without ``cblas_sgemm``. Under a
system OpenBLAS (CI installs Debian's ``libopenblas0-pthread``) the step alone is
still mlx-vlm's bit for bit, and a batched conversation differs from its solo run only
in its float32 samples' last bits: what docs/performance.md says.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from realtime import cpu_blas
from realtime.cpu_blas import BUNDLED, OPENBLAS, BlasChoice, install, resolve
from realtime.errors import UsageError
from realtime.launch.cli import main
from realtime.testing.servers import start_server_process
from tests.helpers import run_python_module


def _no_library(name: str) -> str | None:
    return None


def test_bundled_is_the_default_and_loads_nothing() -> None:
    for value in (None, "", " ", BUNDLED):
        assert resolve(value, system="linux") == BlasChoice(BUNDLED)
        assert resolve(value, system="darwin") == BlasChoice(BUNDLED)
    assert install(BlasChoice(BUNDLED), modules={"mlx.core": object()}) == BlasChoice(BUNDLED)


def test_openblas_is_found_by_the_linker_or_in_the_usual_places() -> None:
    assert resolve(OPENBLAS, system="linux", find_library=lambda _: "libopenblas.so.0") == (
        BlasChoice(OPENBLAS, "libopenblas.so.0")
    )
    usual = "/usr/lib64/libopenblas.so.0"
    found = resolve(OPENBLAS, system="linux", find_library=_no_library, exists=lambda p: p == usual)
    assert found == BlasChoice(OPENBLAS, usual)


@pytest.mark.parametrize(
    ("value", "system", "exists", "message"),
    [
        (OPENBLAS, "linux", False, "no OpenBLAS library found (install"),
        (OPENBLAS, "darwin", True, "only on Linux"),
        ("/opt/blas/libmkl_rt.so", "win32", True, "only on Linux"),
        ("/opt/blas/libmkl_rt.so", "linux", False, "no such file"),
        ("mkl", "linux", True, "expected 'bundled', 'openblas' or a path"),
    ],
)
def test_a_choice_that_cannot_work_is_a_usage_error(
    value: str, system: str, exists: bool, message: str
) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve(value, system=system, find_library=_no_library, exists=lambda _: exists)


def test_a_path_to_a_library_is_a_custom_choice() -> None:
    assert resolve("/opt/blas/libmkl_rt.so", system="linux", exists=lambda _: True) == (
        BlasChoice("custom", "/opt/blas/libmkl_rt.so")
    )


class _Library:
    def __init__(self, *symbols: str) -> None:
        for symbol in symbols:
            setattr(self, symbol, object())


def test_installing_refuses_after_mlx_and_without_cblas_sgemm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cpu_blas, "_active", BlasChoice(BUNDLED))
    choice = BlasChoice(OPENBLAS, "libopenblas.so.0")
    with pytest.raises(UsageError, match="MLX is already loaded"):
        install(choice, modules={"mlx.core": object()}, load=lambda _: _Library("cblas_sgemm"))
    with pytest.raises(UsageError, match="does not export cblas_sgemm"):
        install(choice, modules={}, load=lambda _: _Library("sgemm_"))

    def unloadable(path: str) -> object:
        raise OSError(f"{path}: cannot open shared object file")

    with pytest.raises(UsageError, match=r"cannot load libopenblas\.so\.0"):
        install(choice, modules={}, load=unloadable)
    assert cpu_blas.active() == BlasChoice(BUNDLED)
    assert install(choice, modules={}, load=lambda _: _Library("cblas_sgemm")) == choice
    assert cpu_blas.active() == choice


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope", "expected 'bundled', 'openblas' or a path"),
        ("/no/such/libblas.so", "no such file"),
    ],
)
def test_the_cli_reports_a_bad_choice_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, message: str
) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("--cpu-blas takes a library only on Linux")
    argv = ["generate", "--input", str(tmp_path / "in.wav"), "--output", str(tmp_path / "o.wav")]
    assert main([*argv, "--cpu-blas", value]) == 2
    assert message in capsys.readouterr().err


def _openblas() -> str:
    """The system OpenBLAS, or a skip that says how to get one (a failure in CI)."""
    try:
        choice = resolve(OPENBLAS)
    except UsageError as exc:
        if os.environ.get("REALTIME_REQUIRE_OPENBLAS") == "1":
            pytest.fail(f"REALTIME_REQUIRE_OPENBLAS=1 but {exc}")
        pytest.skip(f"{exc}; CI installs Debian's libopenblas0-pthread")
    assert choice.path is not None
    return choice.path


def test_under_openblas_alone_is_mlx_vlm_and_batched_rows_differ_only_in_last_bits(
    demo_path: Path,
) -> None:
    _openblas()
    output = run_python_module("tests.blas_exchange", str(demo_path))
    result: dict[str, Any] = json.loads(output[-1])
    assert result["blas"] == OPENBLAS
    assert result["alone_is_mlx_vlm"]
    assert result["audio_frames"] == [16, 16, 16]
    assert result["batched_rows_equal_but_samples"] == [True, True, True]
    assert 0 <= result["max_sample_difference"] < 1e-5


def test_serve_reports_the_blas_it_multiplies_with(demo_path: Path) -> None:
    _openblas()
    with start_server_process(
        "-m", str(demo_path), "--max-sessions", "2", env={"REALTIME_CPU_BLAS": OPENBLAS}
    ) as server:
        with urllib.request.urlopen(f"{server.http}/health", timeout=10) as response:
            health = json.load(response)
        with urllib.request.urlopen(f"{server.http}/metrics", timeout=10) as response:
            metrics = response.read().decode()
    assert health["cpu_blas"] == OPENBLAS
    assert health["batch_frames"] is True
    assert 'cpu_blas="openblas"' in metrics
    assert "MLX's CPU matmuls use openblas" in server.log.read_text()
