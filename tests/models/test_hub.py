"""``-m ORG/NAME``: resolution through the Hugging Face cache, offline, and each way a
download fails as one line. Nothing here reaches the real hub: the cache is laid out
by hand as ``huggingface_hub`` lays it out, and the "hub" is a local HTTP server."""

from __future__ import annotations

import errno
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.models import ModelPathError, model_id_for
from realtime.models.hub import download_checkpoint, looks_like_repo_id, resolve_model
from tests.helpers import REPO

REV = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "demo-org/VoiceChat-Demo"


def hub_cache(root: Path, demo: Path, repo_id: str = REPO_ID) -> Path:
    """``demo`` placed in ``root`` as the hub's cache holds a download: blobs, a
    snapshot of symlinks, and ``refs/main``."""
    storage = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / REV
    snapshot.mkdir(parents=True)
    (storage / "blobs").mkdir()
    for index, file in enumerate(sorted(demo.iterdir())):
        blob = storage / "blobs" / f"blob{index:04d}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(REV)
    return snapshot


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env.update(extra)
    return env


def _resolve(spec: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """resolve_model in a fresh process, so huggingface_hub reads this environment."""
    code = (
        "import sys\n"
        "from realtime.models import ModelPathError, check_model_path\n"
        "from realtime.models.hub import resolve_model\n"
        "try:\n"
        "    info = check_model_path(resolve_model(sys.argv[1]))\n"
        "except ModelPathError as exc:\n"
        "    print(exc, file=sys.stderr); sys.exit(2)\n"
        "print(info.path); print(info.model_id)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, spec],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**_env(**env), "PYTHONPATH": str(REPO)},
        timeout=60,
    )


def test_repo_ids_and_paths() -> None:
    assert looks_like_repo_id("mlx-community/NemotronLabs-VoiceChat-11B-4bit")
    for path in ("models", "./a/b", "/abs/path", "a/b/c", "~/x", "../x", "a/..", "C:\\x"):
        assert not looks_like_repo_id(path), path


def test_offline_resolution_from_the_hub_cache(demo_path: Path, tmp_path: Path) -> None:
    snapshot = hub_cache(tmp_path / "hub", demo_path)
    run = _resolve(REPO_ID, tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    assert run.returncode == 0, run.stderr
    path, model_id = run.stdout.split()
    assert Path(path).resolve() == snapshot.resolve()
    assert model_id == "VoiceChat-Demo"  # not the revision the folder is named after
    # HF_HOME alone: the cache is HF_HOME/hub.
    home = tmp_path / "home"
    hub_cache(home / "hub", demo_path)
    run = _resolve(REPO_ID, tmp_path, HF_HOME=str(home), HF_HUB_OFFLINE="1")
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.split()[0]).is_relative_to(home)


def test_a_local_folder_wins(demo_path: Path, tmp_path: Path) -> None:
    local = tmp_path / "demo-org" / "VoiceChat-Demo"
    shutil.copytree(demo_path, local)
    run = _resolve(REPO_ID, tmp_path, HF_HUB_CACHE=str(tmp_path / "empty"), HF_HUB_OFFLINE="1")
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.split()[0]) == Path(REPO_ID)
    assert resolve_model(demo_path) == demo_path


def test_offline_and_not_cached_is_one_line(tmp_path: Path) -> None:
    run = _resolve(REPO_ID, tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert "HF_HUB_OFFLINE is set" in run.stderr and "not in the cache" in run.stderr


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers every request as the hub answers an unknown (404) or gated (401) repo."""

    def do_GET(self) -> None:
        gated = "gated" in self.path
        self.send_response(401 if gated else 404)
        self.send_header("X-Error-Code", "GatedRepo" if gated else "RepoNotFound")
        self.send_header("X-Error-Message", "Access restricted" if gated else "Not found")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def fake_hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


@pytest.mark.parametrize(
    ("repo", "needle"),
    [("someone/unknown-model", "no repo someone/unknown-model"), ("org/gated-model", "gated")],
)
def test_unknown_and_gated_repos_are_one_line(
    repo: str, needle: str, fake_hub: str, tmp_path: Path
) -> None:
    run = _resolve(repo, tmp_path, HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT=fake_hub)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert needle in run.stderr


def test_no_network_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = _resolve(
        REPO_ID,
        tmp_path,
        HF_HUB_CACHE=str(tmp_path / "hub"),
        HF_ENDPOINT=f"http://127.0.0.1:{port}",
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().count("\n") == 0, run.stderr
    assert "cannot be reached" in run.stderr


def test_disk_full_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    def full(*args: object, **kwargs: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", full)
    with pytest.raises(ModelPathError, match="disk full while downloading org/model") as info:
        download_checkpoint("org/model")
    assert "\n" not in str(info.value)


def test_cli_generate_by_repo_id_offline(
    demo_path: Path, demo_cache_dir: Path, tmp_path: Path
) -> None:
    """``realtime generate -m ORG/NAME`` end to end from the cache, offline."""
    import numpy as np

    from realtime.audio import write_wav_pcm16

    hub_cache(tmp_path / "hub", demo_path)
    wav = tmp_path / "in.wav"
    write_wav_pcm16(wav, (np.random.default_rng(0).normal(0, 3000, 8000)).astype(np.int16), 16000)
    env = _env(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    env["REALTIME_CACHE_DIR"] = str(demo_cache_dir)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "realtime",
            "generate",
            "-m",
            REPO_ID,
            "--input",
            str(wav),
            "--output",
            str(tmp_path / "out.wav"),
            "--stream",
            "--extra-seconds",
            "0.2",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out.wav").stat().st_size > 44


def test_model_id_of_a_plain_folder_is_its_name(tmp_path: Path) -> None:
    assert model_id_for(tmp_path / "NemotronLabs-VoiceChat-11B-4bit") == (
        "NemotronLabs-VoiceChat-11B-4bit"
    )
