"""Fast checks of a checkpoint folder, before any MLX import.

``mlx_vlm.load`` would try the Hugging Face hub for a path that does not exist and
fails late, with long messages, on a broken folder. These checks run in
milliseconds and turn every such problem into one line the user can act on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

SUPPORTED_MODEL_TYPES = ("nemotron_voicechat",)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
INDEX_FILE = "model.safetensors.index.json"


class ModelPathError(Exception):
    """The folder cannot be a supported checkpoint; the message is one line for the user."""


class ModelLoadError(Exception):
    """The folder looked right but loading it failed; the message is one line."""


@attrs.frozen(slots=True)
class CheckpointInfo:
    """What the fast check learned about a checkpoint folder."""

    path: Path
    model_type: str
    model_id: str
    shards: tuple[str, ...]
    total_bytes: int
    quantization_bits: int | None


def one_line(text: str) -> str:
    """Collapse a message onto one line (exceptions from libraries often span several)."""
    return " ".join(str(text).split())


def model_id_for(path: str | os.PathLike[str]) -> str:
    """The id clients see: the checkpoint folder's last path component; for a snapshot
    in the Hugging Face cache (``models--org--name/snapshots/<rev>``), ``name``."""
    folder = Path(os.path.abspath(os.fspath(path)))
    repo = folder.parent.parent.name
    if folder.parent.name == "snapshots" and repo.startswith("models--") and "--" in repo[8:]:
        return repo.rsplit("--", 1)[1]
    return folder.name


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelPathError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ModelPathError(f"{what} {path} is not UTF-8 text") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ModelPathError(f"{what} {path} is not valid JSON: {one_line(str(exc))}") from None


def _check_shard(path: Path) -> int:
    """Size of a safetensors file whose header is intact and whose data is all there.

    ``safe_open`` maps the file and checks the header against its length, so a
    shard cut short by an interrupted download is caught here, not inside MLX.
    """
    from safetensors import SafetensorError, safe_open

    try:
        size = path.stat().st_size
        if size < 8:
            raise ModelPathError(f"weight shard {path} is truncated (no header)")
        with safe_open(str(path), framework="numpy"):
            pass
    except OSError as exc:
        raise ModelPathError(f"cannot read weight shard {path}: {exc.strerror or exc}") from None
    except SafetensorError as exc:
        reason = str(exc)
        if "header length" in reason or "too large" in reason:
            raise ModelPathError(f"weight shard {path} is truncated or not safetensors") from None
        if "not fully covered" in reason:
            raise ModelPathError(
                f"weight shard {path} is truncated ({size} bytes, not what its header lists);"
                " download it again"
            ) from None
        raise ModelPathError(f"weight shard {path} has a corrupt safetensors header") from None
    return size


def _weight_shards(path: Path) -> tuple[str, ...]:
    index = path / INDEX_FILE
    if index.exists():
        data = _read_json(index, "weight index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelPathError(f"weight index {index} has no weight_map")
        shards = sorted({str(v) for v in weight_map.values()})
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ModelPathError(
                f"missing weight shard {missing[0]}{more} in {path} (listed in {INDEX_FILE});"
                " the download is incomplete"
            )
        return tuple(shards)
    shards = sorted(p.name for p in path.glob("*.safetensors") if p.is_file())
    if not shards:
        raise ModelPathError(f"no weights in {path}: no {INDEX_FILE} and no *.safetensors files")
    return tuple(shards)


def check_model_path(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Validate a checkpoint folder without MLX; raise ModelPathError with one line.

    Checks: a directory, a parseable ``config.json`` with a supported ``model_type``,
    every weight shard present with an intact header and full data, tokenizer files.
    """
    folder = Path(os.fspath(path)).expanduser()
    if not folder.exists():
        raise ModelPathError(
            f"model path {folder} does not exist (give a checkpoint folder or a Hugging Face "
            "repo id such as mlx-community/NemotronLabs-VoiceChat-11B-4bit)"
        )
    if not folder.is_dir():
        raise ModelPathError(f"model path {folder} is not a directory")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelPathError(f"{folder} has no config.json; is it a checkpoint folder?")
    config = _read_json(config_path, "config")
    if not isinstance(config, dict):
        raise ModelPathError(f"config {config_path} is not a JSON object")
    model_type = config.get("model_type")
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is None:
        raise ModelPathError(f"{config_path} has no model_type; supported: {supported}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelPathError(
            f"unsupported model_type {one_line(repr(model_type))} in {config_path};"
            f" supported: {supported}"
        )
    shards = _weight_shards(folder)
    total = sum(_check_shard(folder / shard) for shard in shards)
    missing = [name for name in TOKENIZER_FILES if not (folder / name).is_file()]
    if missing:
        raise ModelPathError(f"missing tokenizer file {', '.join(missing)} in {folder}")
    quantization = config.get("quantization")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    return CheckpointInfo(
        path=folder,
        model_type=str(model_type),
        model_id=model_id_for(folder),
        shards=shards,
        total_bytes=total,
        quantization_bits=bits if isinstance(bits, int) else None,
    )
