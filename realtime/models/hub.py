"""``-m`` by name: a Hugging Face repo id resolved to a checkpoint folder.

``realtime serve -m mlx-community/NemotronLabs-VoiceChat-11B-4bit`` works as it does
in mlx-lm and mlx-vlm: a local folder of that name always wins; otherwise the
repo is fetched through ``huggingface_hub`` into its standard cache (``HF_HOME``,
``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` uses the cache only, ``HF_TOKEN`` for gated
repos), downloading only what a checkpoint needs (configs, weight index, safetensors
shards, tokenizer files) with huggingface_hub's progress bars. The caller then
verifies the folder with :func:`realtime.models.checkpoint.check_model_path`.

Every way a download can fail (no network, unknown repo, gated repo, full disk)
becomes one :class:`ModelPathError` line, which the command line exits 2 with.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Final

from realtime.models.checkpoint import ModelPathError, one_line

CHECKPOINT_PATTERNS: Final = (
    "*.json",  # config, weight index, tokenizer and processor configs
    "*.safetensors",
    "*.jinja",  # chat templates
    "*.model",  # sentencepiece tokenizers
    "*.tiktoken",
    "*.txt",  # merges / vocabularies of some tokenizers
)
"""What a checkpoint needs; READMEs, images, other weight formats and code are skipped."""

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def looks_like_repo_id(spec: str) -> bool:
    """``org/name`` (one slash, no path syntax): a candidate Hugging Face repo id."""
    return bool(_REPO_ID.match(spec)) and ".." not in spec and not spec.endswith((".", "-"))


def resolve_model(spec: str | os.PathLike[str]) -> Path:
    """The local folder ``spec`` names: itself when it exists (or is no repo id),
    else the hub snapshot of the repo ``spec``, downloaded when not cached."""
    text = os.fspath(spec)
    local = Path(text).expanduser()
    if local.exists() or not looks_like_repo_id(text):
        return local
    return download_checkpoint(text)


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def download_checkpoint(repo_id: str) -> Path:
    """The snapshot folder of ``repo_id`` in the hub cache, fetched when missing."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HFValidationError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelPathError(
            f"model path {repo_id} does not exist, and huggingface_hub (needed to download "
            "it) is not installed: pip install huggingface_hub"
        ) from None
    where = _cache_dir()
    try:
        folder = snapshot_download(repo_id, allow_patterns=list(CHECKPOINT_PATTERNS))
    except GatedRepoError:
        raise ModelPathError(
            f"{repo_id} is a gated repo on the Hugging Face Hub: accept its terms on "
            f"https://huggingface.co/{repo_id}, then log in with 'hf auth login' "
            "(or set HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ModelPathError(
            f"no local folder {repo_id}, and no repo {repo_id} on the Hugging Face Hub "
            "(a private repo needs 'hf auth login' or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError as exc:
        raise ModelPathError(f"cannot download {repo_id}: {_first_line(exc)}") from None
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub cannot be reached"
        raise ModelPathError(
            f"cannot download {repo_id}: {why} and it is not in the cache {where} "
            "(no local folder of that name either)"
        ) from None
    except HFValidationError as exc:
        raise ModelPathError(f"model path {repo_id} does not exist ({_first_line(exc)})") from None
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ModelPathError(
                f"disk full while downloading {repo_id} into {where}: free some space "
                "or point HF_HUB_CACHE (or HF_HOME) at a larger disk"
            ) from None
        raise ModelPathError(f"cannot download {repo_id}: {_first_line(exc)}") from None
    if not isinstance(folder, str):  # a dry run's file list; never asked for here
        raise ModelPathError(f"cannot download {repo_id}")
    return Path(folder)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return one_line(text[0] if text else type(exc).__name__)
