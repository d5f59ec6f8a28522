"""``realtime serve --warm-prompt BAD`` exits 2 with one line for
every bad file, and never aborts on the way out.

Before: a 100,000-deep JSON file gave a Python traceback and exit 1; a 64 MB text file
and a session whose ``instructions`` is not a string were refused with one line once
the model had loaded, and then the process aborted in MLX's static destructors
(``terminate called without an active exception``, SIGABRT) in most runs. Now the file
is bounded (size, then structure) and checked before the model loads, and a refusal
after the load (a prompt over the token limit) leaves through the exit that skips
MLX's teardown (``realtime.launch.cli.run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.models_fixtures import REPO_ROOT, run_realtime, subprocess_env


def serve_with(cache_dir: Path, prompt: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_realtime(
        cache_dir,
        "--log-level",
        "error",
        "serve",
        "--port",
        "0",
        "--warm-prompt",
        str(prompt),
        *extra,
    )


def deep_json(path: Path) -> None:
    path.write_text("[" * 100_000 + "]" * 100_000, "utf-8")


def huge_text(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(64 << 20)  # 64 MB (of NUL characters: valid UTF-8)


def not_a_string(path: Path) -> None:
    path.write_text(json.dumps({"instructions": 5}), "utf-8")


def not_utf8(path: Path) -> None:
    path.write_bytes(b"\xff\xfe be brief")


def a_directory(path: Path) -> None:
    path.mkdir()


def missing(path: Path) -> None:
    del path


BAD_FILES: list[tuple[str, Callable[[Path], None], str]] = [
    ("deep.json", deep_json, "holds more than 4096 JSON values"),
    ("huge.txt", huge_text, "over the 4194304-byte limit"),
    ("session.json", not_a_string, "instructions must be a string"),
    ("latin.txt", not_utf8, "is not UTF-8 text"),
    ("prompts", a_directory, "it is a directory"),
    ("missing.txt", missing, "No such file or directory"),
]


def one_refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The process exited 2 with exactly one line on stderr (no traceback, no abort)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("realtime: error: "), lines
    assert "terminate called" not in done.stderr
    return lines[0]


@pytest.mark.parametrize(("name", "make", "why"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_warm_prompt_file_is_one_line_and_exit_2(
    tmp_path: Path, name: str, make: Callable[[Path], None], why: str
) -> None:
    """Each refused before the model loads (no model is needed to find it bad)."""
    path = tmp_path / name
    make(path)
    line = one_refusal(serve_with(tmp_path / "cache", path))
    assert why in line and str(path) in line, line


@pytest.mark.slow
def test_a_prompt_refused_after_the_load_exits_2_without_an_abort(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    """The token count needs the model's tokenizer, so this refusal comes from the
    engine thread once MLX has run there: three runs, each exit 2 and one line (the
    abort came in most runs before)."""
    prompt = tmp_path / "agent.txt"
    prompt.write_text("Be brief and kind to every caller. " * 5, "utf-8")  # counted
    for _ in range(3):
        done = serve_with(demo_cache_dir, prompt, "--max-system-prompt-tokens", "8")
        line = one_refusal(done)
        assert "the 8-token limit" in line, line
    assert not os.path.exists(tmp_path / "core")


@pytest.mark.slow
def test_under_the_hypercorn_cli_a_prompt_refused_after_the_load_ends_the_command(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    """``hypercorn -k trio realtime.launch.asgi:app``: the same refusal, once the model has
    loaded at lifespan startup, ends the command with one line (non-zero: Hypercorn
    loses its worker's status, pgjones/hypercorn#269). Before: a traceback, and
    Hypercorn went on serving with no model."""
    prompt = tmp_path / "agent.txt"
    prompt.write_text("Be brief and kind to every caller. " * 5, "utf-8")
    env = {
        **subprocess_env(demo_cache_dir),
        "REALTIME_WARM_PROMPT": str(prompt),
        "REALTIME_MAX_SYSTEM_PROMPT_TOKENS": "8",
        "REALTIME_LOG_LEVEL": "error",
    }
    hypercorn = os.path.join(os.path.dirname(sys.executable), "hypercorn")
    done = subprocess.run(
        [hypercorn, "-k", "trio", "-b", "127.0.0.1:0", "realtime.launch.asgi:app"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert done.returncode != 0, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("realtime: error:")]
    assert len(errors) == 1 and "the 8-token limit" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "terminate called" not in done.stderr
