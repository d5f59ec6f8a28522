"""What the benchmark commands share around their measurements: the parser preamble for
"which checkpoint" (``--model`` or a demo ``--size``) and "where to" (``--json``),
resolving the checkpoint, and writing the figures as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

MODEL_HELP = "checkpoint folder (default: the demo one)"


def checkpoint_parser(
    module: str,
    description: str | None,
    *,
    model_help: str = MODEL_HELP,
    size_help: str | None = None,
) -> argparse.ArgumentParser:
    """A parser for ``python -m MODULE`` whose description keeps its own line breaks,
    with the ``--model``, ``--size`` and ``--json`` options every checkpoint benchmark
    takes (``--json`` for :func:`write_json`)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {module}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, help=model_help)
    parser.add_argument("--size", choices=["tiny", "medium"], default="tiny", help=size_help)
    parser.add_argument("--json", type=Path, help="write every figure here as JSON")
    return parser


def model_path(args: argparse.Namespace) -> Path:
    """The checkpoint ``--model`` names (checked as ``realtime serve`` checks it, so a bad
    path is a clear message), else the demo checkpoint of ``--size``, built if missing."""
    if args.model is not None:
        from realtime.models import check_model_path

        check_model_path(str(args.model))
        return Path(args.model).resolve()
    from realtime.demo.checkpoint import SIZES, ensure_demo_checkpoint

    return ensure_demo_checkpoint(size=SIZES[args.size])


def write_json(path: Path | None, figures: dict[str, Any]) -> None:
    """Write ``figures`` to ``path`` (the ``--json`` option) as indented JSON; None: not
    asked for."""
    if path is not None:
        path.write_text(json.dumps(figures, indent=2) + "\n")
