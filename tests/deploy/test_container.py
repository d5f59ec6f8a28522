"""deploy/container/Containerfile built (CPU backend) and run with Podman, no registry.

The base is Debian 12 made by ``debootstrap`` (``podman build --from`` replaces the
``FROM`` line's registry image), cached as a tarball between runs. The test checks
what docs/deploy.md promises: ``/health`` 200 (and the image's ``HEALTHCHECK``), one
conversation through the file client, and SIGTERM ending the container within the
shutdown bound. Skips, with the reason, where Podman cannot run; CI sets
``REALTIME_REQUIRE_CONTAINER=1`` so that it fails instead.

Host facts it relies on (docs/deploy.md): a ``containers.conf`` with
``default_ulimits = []`` and the ``runc`` runtime; pip inside the build reaches the
package index with the host's CA bundle, mounted as one file and named by ``PIP_CERT``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

from tests.helpers import REPO, connect, http

# The first build makes the Debian base with debootstrap (minutes, from the mirror).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

BASE_IMAGE = "localhost/realtime-base:bookworm"
IMAGE = "localhost/realtime:ci"
BASE_PACKAGES = "python3,python3-venv,ca-certificates,libopenblas0-pthread"
"""What the Containerfile would otherwise install with apt (then it runs no apt)."""
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
MIRROR = os.environ.get("REALTIME_DEBIAN_MIRROR", "http://deb.debian.org/debian")
CACHE = Path(
    os.environ.get("REALTIME_CONTAINER_CACHE", Path.home() / ".cache" / "realtime-container")
)
"""The debootstrap base as a tarball, kept between runs (CI: between steps)."""
SHUTDOWN_BOUND = 5.0 + 3.0 + 5.0
"""``--shutdown-timeout`` (5 s), the engine join (3 s), and the container runtime's
own stop, with room for a loaded machine."""


def unavailable(reason: str) -> None:
    if os.environ.get("REALTIME_REQUIRE_CONTAINER") == "1":
        pytest.fail(f"REALTIME_REQUIRE_CONTAINER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """The podman command line (with its containers.conf), once it has run a container."""
    exe = shutil.which("podman")
    if exe is None:
        unavailable("podman is not installed (apt-get install podman runc)")
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    # No default ulimits (podman's raise fails in unprivileged sandboxes); runc, since
    # crun fails on some hosts' cgroups.
    conf.write_text('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n')
    os.environ["CONTAINERS_CONF"] = str(conf)
    command = [str(exe)]
    if subprocess.run([*command, "image", "exists", BASE_IMAGE], check=False).returncode:
        _import_base(command)
    probe = subprocess.run(
        [*command, "run", "--rm", "--network", "host", BASE_IMAGE, "true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if probe.returncode:
        unavailable(f"podman cannot run a container here: {probe.stderr.strip()[-300:]}")
    yield command


def _import_base(podman: list[str]) -> None:
    """Debian 12 (minbase) made by debootstrap, imported as ``BASE_IMAGE``."""
    tarball = CACHE / "bookworm-minbase.tar"
    if not tarball.exists():
        debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
        if not Path(debootstrap).exists():
            unavailable("debootstrap is not installed (apt-get install debootstrap)")
        if os.geteuid() != 0:
            unavailable("debootstrap needs root to build the base image")
        debs = CACHE / "debs"  # the packages, kept for the next base
        debs.mkdir(parents=True, exist_ok=True)
        root = CACHE / "rootfs"
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                f"--cache-dir={debs}",
                "bookworm",
                str(root),
                MIRROR,
            ],
            check=True,
            capture_output=True,
            timeout=900,
        )
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(tarball)
        shutil.rmtree(root, ignore_errors=True)
    with tarball.open("rb") as data:
        subprocess.run([*podman, "import", "-", BASE_IMAGE], stdin=data, check=True, timeout=300)


@pytest.fixture(scope="module")
def image(podman: list[str]) -> str:
    """The Containerfile built from the debootstrap base, CPU backend."""
    command = [
        *podman,
        "build",
        "--format",
        "docker",  # HEALTHCHECK is a Docker-format field; OCI images drop it
        "--from",
        BASE_IMAGE,
        "--build-arg",
        "MLX_BACKEND=cpu",
        "-f",
        str(REPO / "deploy" / "container" / "Containerfile"),
        "-t",
        IMAGE,
    ]
    if CA_BUNDLE.exists():
        # One file: mounting the whole of /etc/ssl/certs breaks dpkg in the build.
        command += ["--volume", f"{CA_BUNDLE}:/run/host-ca.crt:ro"]
        command += ["--build-arg", "PIP_CERT=/run/host-ca.crt"]
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None and (REPO / ".venv" / "bin" / "uv").exists():
        uv = str(REPO / ".venv" / "bin" / "uv")
    if uv is not None:
        # The host's uv and its cache (the test's own environment was installed from
        # it): the build installs from there instead of downloading ~1 GB again.
        cache = subprocess.run(
            [uv, "cache", "dir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        Path(cache).mkdir(parents=True, exist_ok=True)
        command += ["--volume", f"{uv}:/run/uv/uv:ro", "--volume", f"{cache}:/run/uv/cache"]
    started = time.monotonic()
    build = subprocess.run(
        [*command, str(REPO)], capture_output=True, text=True, timeout=900, check=False
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(f"container build: {time.monotonic() - started:.0f} s")
    return IMAGE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def speech(path: Path, seconds: float = 1.5) -> None:
    rate = 16000
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())


def test_the_image_serves_a_conversation_and_stops_on_sigterm(
    podman: list[str], image: str, tmp_path: Path
) -> None:
    port = free_port()
    name = f"realtime-ci-{port}"
    env = f"REALTIME_PORT={port}"  # the server's port, and its health check's
    run = subprocess.run(
        [*podman, "run", "-d", "--name", name, "--network", "host", "--env", env, image],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while True:
            try:
                status, body = http("GET", base + "/health")
            except OSError:
                status, body = 0, None
            if status == 200:
                break
            assert time.monotonic() < deadline, _logs(podman, name)
            time.sleep(1)
        assert body["status"] == "ok", body
        check = subprocess.run(
            [*podman, "healthcheck", "run", name], capture_output=True, text=True, check=False
        )
        assert check.returncode == 0, check.stdout + check.stderr
        whoami = subprocess.run(
            [*podman, "exec", name, "id", "-u"], capture_output=True, text=True, check=True
        )
        assert whoami.stdout.strip() != "0"  # not root

        speech(tmp_path / "in.wav")
        client = subprocess.run(
            [
                sys.executable,
                str(REPO / "examples" / "voicechat_file_client.py"),
                f"ws://127.0.0.1:{port}/v1/realtime",
                str(tmp_path / "in.wav"),
                str(tmp_path / "out.wav"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert client.returncode == 0, client.stdout + client.stderr
        with wave.open(str(tmp_path / "out.wav")) as answer:
            assert answer.getnframes() > 0

        # SIGTERM with a conversation open: closed 1001 (no drain by default), and the
        # container exits 0 within the shutdown bound.
        started = time.monotonic()
        code = trio.run(sigterm_during_a_conversation, podman, name, port)
        waited = subprocess.run(
            [*podman, "wait", name], capture_output=True, text=True, timeout=60, check=True
        )
        stopped = time.monotonic() - started
        print(f"container stop on SIGTERM, a conversation open: {stopped:.1f} s")
        assert code == 1001, code
        assert waited.stdout.strip() == "0", _logs(podman, name)
        assert stopped < SHUTDOWN_BOUND, stopped
    finally:
        subprocess.run([*podman, "rm", "-f", name], capture_output=True, check=False)


async def sigterm_during_a_conversation(podman: list[str], name: str, port: int) -> int | None:
    """Open a conversation, SIGTERM the container, and return the close code it gets."""
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as client:
        await client.configure()
        await trio.to_thread.run_sync(
            partial(subprocess.run, [*podman, "kill", "--signal", "TERM", name], check=True)
        )
        return await client.closed_code(timeout=SHUTDOWN_BOUND)


def _logs(podman: list[str], name: str) -> str:
    return subprocess.run(
        [*podman, "logs", name], capture_output=True, text=True, check=False
    ).stdout[-3000:]
