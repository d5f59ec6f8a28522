"""Model states kept on disk across restarts: one directory, bounded by bytes, each
file written atomically and read only when its key matches (no MLX here).

A prompt state (:mod:`realtime.models.prompt_cache`) is a pure function of the
checkpoint, the prompt's tokens or the seed, and everything that decides the bits
the model computes: the MLX version and backend, the CBLAS it multiplies with, the
load-time casts and fused modules, the model code's version. :class:`StateFiles`
names each file by a digest of that identity and the entry's own name, and writes the
identity into the file's header (a safetensors ``__metadata__`` entry); a file is
used only when the header says exactly what this process would have written, and
its data digest matches. Anything else (cut short, bits flipped, another checkpoint's
or another version's file, a file that cannot be parsed) is ignored with one log
line and never trusted; the next write replaces it.

Writes go to a temporary file in the directory and are renamed into place, so a
reader (another process sharing the directory) sees the old file or the new one,
never half of one; a lock file serialises writers and the eviction that keeps the
directory within its bytes (least recently used first: a read touches its file).
What the arrays are and how they are saved is the model's (a ``save`` callback).

The checkpoint's part of the identity is a digest of its files' contents
(:func:`checkpoint_digest`): each file is read once and its SHA-256 remembered in the
directory by its size, modification time and inode, so later starts hash nothing
unless a file changed (a file in the Hugging Face cache is named by its digest
already and is never read for it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Final, TypeVar

log = logging.getLogger(__name__)

STATE_CACHE_DIR_ENV: Final = "REALTIME_STATE_CACHE_DIR"
"""``--state-cache-dir`` as an environment setting (empty: no files)."""

FORMAT: Final = 1
"""The layout of a state file; a new layout is a new identity (old files are ignored)."""

KEY_FIELD: Final = "realtime.key"
"""The header's entry holding the file's key (its identity and name, as JSON)."""

SUFFIX: Final = ".safetensors"
_TMP_PREFIX: Final = ".tmp-"
_STALE_TMP_SECONDS: Final = 3600.0
_MEMO: Final = "checkpoints.json"
_MAX_HEADER: Final = 16 << 20
_HASH_CHUNK: Final = 8 << 20
_HF_BLOB: Final = re.compile(r"[0-9a-f]{64}")

A = TypeVar("A")


def cache_root() -> Path:
    """``$REALTIME_CACHE_DIR`` if set, else the per-user cache folder."""
    override = os.environ.get("REALTIME_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("realtime"))


def default_state_dir() -> Path:
    """Where states are kept unless ``--state-cache-dir`` says otherwise."""
    return cache_root() / "states"


def state_dir_from(value: str | None) -> Path | None:
    """The directory a ``--state-cache-dir`` value names: ``None`` (unset) is the
    default, ``''`` none (nothing on disk)."""
    if value is None:
        return default_state_dir()
    if not value.strip():
        return None
    return Path(value).expanduser()


def read_header(path: Path) -> dict[str, object]:
    """A safetensors file's JSON header (ValueError when it is not one)."""
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) != 8:
            raise ValueError("no header")
        (length,) = struct.unpack("<Q", head)
        if not 0 < length <= _MAX_HEADER:
            raise ValueError(f"a header of {length} bytes")
        raw = file.read(length)
    if len(raw) != length:
        raise ValueError("the header is cut short")
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("the header is not a JSON object")
    return value


class StateFiles:
    """The state files of one identity in ``directory`` (created when missing), at
    most ``max_bytes`` of them in all (every identity's files together: the directory
    is the bound). Not thread-safe: one engine thread uses it; processes share the
    directory through its lock file."""

    def __init__(self, directory: Path, max_bytes: int, identity: Mapping[str, object]) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.directory = directory
        self.max_bytes = max_bytes
        self.identity = json.dumps(dict(identity), sort_keys=True)
        self.reads = 0
        """Files read and used."""
        self.writes = 0
        self.ignored = 0
        """Files found but not trusted (corrupt, foreign, unreadable)."""
        directory.mkdir(parents=True, exist_ok=True)

    def key(self, name: str) -> str:
        """What a file of entry ``name`` holds in its header."""
        return json.dumps({"format": FORMAT, "identity": self.identity, "name": name})

    def path(self, name: str) -> Path:
        digest = hashlib.sha256(self.key(name).encode()).hexdigest()[:40]
        return self.directory / f"{digest}{SUFFIX}"

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def read(self, name: str, load: Callable[[Path], tuple[A, Mapping[str, str]]]) -> A | None:
        """Entry ``name`` as ``load`` reads it (its value and header metadata), or
        ``None``: no file, or one that is not this entry's (logged once, ignored).
        ``load`` raises for a file it cannot read whole (its data digest included)."""
        path = self.path(name)
        if not path.is_file():
            return None
        try:
            header = read_header(path)
            metadata = header.get("__metadata__")
            if not isinstance(metadata, dict) or metadata.get(KEY_FIELD) != self.key(name):
                self._ignore(path, "it was written for another checkpoint, version or entry")
                return None
            value, loaded = load(path)
            if loaded.get(KEY_FIELD) != self.key(name):
                self._ignore(path, "its key changed while it was read")
                return None
        except FileNotFoundError:
            return None  # evicted by another process meanwhile
        except Exception as exc:  # anything at all: the file is not trusted
            self._ignore(path, f"{type(exc).__name__}: {' '.join(str(exc).split())}")
            return None
        try:
            os.utime(path)  # least recently used last
        except OSError:
            pass
        self.reads += 1
        return value

    def _ignore(self, path: Path, why: str) -> None:
        self.ignored += 1
        log.warning("ignoring the state file %s: %s", path, why)

    def write(self, name: str, save: Callable[[Path, dict[str, str]], None]) -> bool:
        """Write entry ``name`` with ``save(path, metadata)`` (the metadata holds its
        key), atomically, then evict to the bound; False (logged) when it could not
        be written or does not fit."""
        from filelock import FileLock

        if self.max_bytes == 0:
            return False
        tmp = self.directory / f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}{SUFFIX}"
        try:
            save(tmp, {KEY_FIELD: self.key(name)})
            size = tmp.stat().st_size
            if size > self.max_bytes:
                log.warning(
                    "the state %s (%d bytes) is larger than --state-cache-bytes %d; not kept",
                    name,
                    size,
                    self.max_bytes,
                )
                return False
            with FileLock(str(self.directory / ".lock")):
                os.replace(tmp, self.path(name))
                self._evict(keep=self.path(name))
        except Exception as exc:
            log.warning(
                "could not write the state file for %s in %s: %s", name, self.directory, exc
            )
            return False
        finally:
            tmp.unlink(missing_ok=True)
        self.writes += 1
        return True

    def _evict(self, keep: Path) -> None:
        """Remove the least recently used files (and stale temporaries) until the
        directory holds at most ``max_bytes``; under the lock."""
        now = time.time()
        files: list[tuple[float, int, Path]] = []
        for path in self.directory.iterdir():
            try:
                stat = path.stat()
            except OSError:
                continue
            if path.name.startswith(_TMP_PREFIX):
                if now - stat.st_mtime > _STALE_TMP_SECONDS:
                    path.unlink(missing_ok=True)
            elif path.suffix == SUFFIX:
                files.append((stat.st_mtime, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            if path != keep:
                path.unlink(missing_ok=True)
                total -= size

    def held_bytes(self) -> int:
        """What the directory's state files take now (all identities)."""
        total = 0
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                total += path.stat().st_size
            except OSError:
                continue
        return total


def checkpoint_digest(files: Iterable[Path], memo_dir: Path) -> str:
    """A digest of these files' names and contents (a checkpoint's), each file's own
    digest remembered in ``memo_dir`` by its size, modification time and inode."""
    memo_dir.mkdir(parents=True, exist_ok=True)
    memo_path = memo_dir / _MEMO
    try:
        memo = json.loads(memo_path.read_text("utf-8"))
        if not isinstance(memo, dict):
            memo = {}
    except (OSError, ValueError):
        memo = {}
    changed = False
    total = hashlib.sha256()
    began = time.perf_counter()
    hashed = 0
    for path in sorted(files, key=lambda p: p.name):
        real = os.path.realpath(path)
        stat = os.stat(real)
        signature = [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev]
        remembered = memo.get(real)
        if _HF_BLOB.fullmatch(os.path.basename(real)) and os.path.islink(path):
            digest = os.path.basename(real)  # the Hugging Face cache names blobs by digest
        elif isinstance(remembered, dict) and remembered.get("stat") == signature:
            digest = str(remembered.get("sha256"))
        else:
            digest = _file_digest(Path(real))
            hashed += stat.st_size
            memo[real] = {"stat": signature, "sha256": digest}
            changed = True
        total.update(f"{path.name}\0{digest}\0".encode())
    if changed:
        _write_memo(memo_path, memo)
    if hashed:
        log.info(
            "hashed %.1f MB of checkpoint files in %.1f s for the state files' key "
            "(remembered in %s until they change)",
            hashed / 1e6,
            time.perf_counter() - began,
            memo_path,
        )
    return total.hexdigest()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _write_memo(path: Path, memo: Mapping[str, object]) -> None:
    from filelock import FileLock

    tmp = path.with_name(f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}.json")
    try:
        tmp.write_text(json.dumps(memo, sort_keys=True), "utf-8")
        with FileLock(str(path.parent / ".lock")):
            os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not remember the checkpoint digests in %s: %s", path, exc)
    finally:
        tmp.unlink(missing_ok=True)


__all__ = [
    "STATE_CACHE_DIR_ENV",
    "StateFiles",
    "cache_root",
    "checkpoint_digest",
    "default_state_dir",
    "read_header",
    "state_dir_from",
]
