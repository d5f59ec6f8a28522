"""MLX loads after the CBLAS choice (realtime/cpu_blas.py) at one boundary: the modules
of ``realtime/models/voicechat/`` and ``realtime/demo/checkpoint/`` import MLX at module
level, and no other module of the package imports them (or MLX) at module level, only
inside the functions that load or build a model (``realtime.models.load_model``, the
demo's loader), which run after ``cpu_blas.install_from``. The one exception is
VoiceChat's tool format (``realtime/models/voicechat/tools.py``, pure text): the
dialects and the demo import it, and it imports no MLX."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import realtime

INSIDE = ("realtime.models.voicechat", "realtime.demo.checkpoint")
PURE = ("realtime.models.voicechat", "realtime.models.voicechat.tools")
"""Of the model folders, the tool format and its package (whose ``__init__`` imports
nothing): any module may import them, and they import no MLX."""


def _modules() -> list[str]:
    root = Path(realtime.__file__).parent
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name != "realtime.__main__":
            names.append(name)
    return names


def test_only_the_model_folders_import_mlx_at_module_level() -> None:
    outside = [name for name in _modules() if not name.startswith(INSIDE) or name in PURE]
    assert len(outside) > 50
    code = (
        "import importlib, json, sys\n"
        "names, inside, pure = json.loads(sys.argv[1])\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_vlm', 'mlx_audio')]\n"
        "loaded += [m for m in sys.modules if m.startswith(tuple(inside)) and m not in pure]\n"
        "print(json.dumps(sorted(loaded)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps([outside, INSIDE, PURE])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout) == []


def test_the_model_folders_do_import_mlx() -> None:
    code = "import sys, realtime.models.voicechat.step; print('mlx.core' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "True"
