"""Prompt states kept on disk (``--state-cache-dir``) and the voice chain built ahead of
need: a chain or a prompt read back is the built one bit for bit; a corrupt or foreign
file is ignored; processes sharing a directory never corrupt it; the idle builder never
makes a frame late (the scheduler's pure rule, by counts)."""

from __future__ import annotations

import json
import os
import struct
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from realtime.engine.scheduler import idle_steps
from realtime.models.prompt_cache import KeepsStates
from realtime.models.state_files import KEY_FIELD, StateFiles, read_header, state_dir_from
from realtime.models.voicechat.model import VoiceChatModel
from realtime.models.voicechat.prompt import (
    VoiceChain,
    _chain_name,
    _language_name,
    prompt_ids,
)
from tests.engine.test_isolation import LONG_PROMPT
from tests.models.test_prompt_cache import ours, theirs
from tests.models.voicechat.test_voice_chain import assert_equal_state, cold_state
from tests.models_fixtures import run_python, subprocess_env

# --- the directory (no model) -------------------------------------------------------------


def _save(payload: bytes) -> Any:
    """A ``save`` writing a safetensors file of one uint8 array holding ``payload``."""

    def save(path: Path, metadata: dict[str, str]) -> None:
        from safetensors.numpy import save_file

        save_file({"x": np.frombuffer(payload, dtype=np.uint8)}, str(path), metadata=metadata)

    return save


def _load(path: Path) -> tuple[bytes, dict[str, str]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as file:
        return bytes(file.get_tensor("x").tobytes()), dict(file.metadata())


def test_a_file_is_read_only_under_its_own_key(tmp_path: Path) -> None:
    files = StateFiles(tmp_path, 1 << 20, {"checkpoint": "a"})
    assert files.read("x", _load) is None  # nothing yet
    assert files.write("x", _save(b"hello"))
    assert files.read("x", _load) == b"hello"
    assert json.loads(read_header(files.path("x"))["__metadata__"][KEY_FIELD])["name"] == "x"  # type: ignore[index]
    other = StateFiles(tmp_path, 1 << 20, {"checkpoint": "b"})
    assert other.path("x") != files.path("x")
    assert other.read("x", _load) is None
    # Another identity's file put where this one's would be: foreign, ignored.
    os.replace(files.path("x"), other.path("x"))
    assert other.read("x", _load) is None and other.ignored == 1
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize("damage", ["truncated", "header", "empty"])
def test_a_damaged_file_is_ignored(tmp_path: Path, damage: str) -> None:
    files = StateFiles(tmp_path, 1 << 20, {"checkpoint": "a"})
    assert files.write("x", _save(b"0123456789" * 100))
    path = files.path("x")
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[:-7])
    elif damage == "header":
        (length,) = struct.unpack("<Q", raw[:8])
        path.write_bytes(raw[:8] + b"#" * length + raw[8 + length :])
    else:
        path.write_bytes(b"")
    assert files.read("x", _load) is None
    assert files.ignored == 1 and files.reads == 0
    assert files.write("x", _save(b"again"))  # the next write replaces it
    assert files.read("x", _load) == b"again"


def test_the_directory_keeps_its_bytes_least_recently_read_first(tmp_path: Path) -> None:
    files = StateFiles(tmp_path, 3000, {"checkpoint": "a"})
    for name in ("a", "b"):
        assert files.write(name, _save(bytes(1000)))
    os.utime(files.path("a"), (1, 1))
    os.utime(files.path("b"), (2, 2))
    assert files.read("a", _load) is not None  # now a is the most recently used
    assert files.write("c", _save(bytes(1000)))
    assert not files.exists("b") and files.exists("a") and files.exists("c")
    assert files.held_bytes() <= 3000
    assert not files.write("huge", _save(bytes(5000)))  # larger than the bound
    assert not StateFiles(tmp_path, 0, {}).write("a", _save(b"x"))  # 0: nothing on disk


def test_the_state_dir_setting() -> None:
    assert state_dir_from("") is None and state_dir_from("  ") is None
    assert state_dir_from("/x/y") == Path("/x/y")
    default = state_dir_from(None)
    assert default is not None and default.name == "states"


_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import numpy as np
    from safetensors.numpy import save_file
    from realtime.models.state_files import StateFiles

    files = StateFiles(Path(sys.argv[1]), 1 << 30, {"checkpoint": "shared"})
    me = int(sys.argv[2])
    for round in range(40):
        for name in ("a", "b", "c"):
            payload = np.full(20000, me, dtype=np.uint8)
            files.write(name, lambda p, m: save_file({"x": payload}, str(p), metadata=m))
    """
)


def test_processes_sharing_a_directory_never_corrupt_it(tmp_path: Path) -> None:
    """Two processes write the same entries at once: every file read after is whole
    and one writer's."""
    import subprocess

    env = subprocess_env(tmp_path / "cache")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path / "states"), str(n)],
            env=env,
        )
        for n in (1, 2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    files = StateFiles(tmp_path / "states", 1 << 30, {"checkpoint": "shared"})
    for name in ("a", "b", "c"):
        value = files.read(name, _load)
        assert value is not None and len(set(value)) == 1 and value[0] in (1, 2)
    assert files.ignored == 0 and not list((tmp_path / "states").glob(".tmp-*"))


# --- the idle builder's rule, by counts -----------------------------------------------------


def _late_frames(
    frame_seconds: float, frame_cost: float, step_cost: float, rule: Any, frames: int = 500
) -> tuple[int, int]:
    """An engine serving one conversation streaming in real time (a frame every
    ``frame_seconds``, each ``frame_cost`` to run) and building ahead in the gaps with
    slices of ``rule(...)`` steps of ``step_cost``: (frames late, idle steps run)."""
    now, late, built, paced = 0.0, 0, 0, 0.0
    arrivals = [i * frame_seconds + 0.004 * (i % 5) for i in range(frames)]  # network jitter
    queue: list[float] = []
    i = 0
    while i < frames or queue:
        while i < frames and arrivals[i] <= now:
            paced = max(arrivals[i], paced) + frame_seconds  # Scheduler.add_paced's due
            queue.append(paced)
            i += 1
        if queue:
            due = queue.pop(0)
            now += frame_cost
            late += now > due
            continue
        steps = rule(
            streaming=True,
            frame_cost=frame_cost,
            step_cost=step_cost,
            frame_seconds=frame_seconds,
            most=16,
        )
        if steps == 0:
            now = arrivals[i] if i < frames else now
            continue
        now += steps * step_cost
        built += steps
    return late, built


@pytest.mark.parametrize(
    ("frame_cost", "step_cost"), [(0.02, 0.005), (0.05, 0.012), (0.07, 0.02), (0.03, 0.03)]
)
def test_the_idle_builder_never_makes_a_frame_late(frame_cost: float, step_cost: float) -> None:
    late, built = _late_frames(0.08, frame_cost, step_cost, idle_steps)
    assert late == 0
    if frame_cost + 2 * step_cost <= 0.08:
        assert built > 0  # it does use the room frames leave

    def greedy(**_: Any) -> int:
        return 16

    assert _late_frames(0.08, frame_cost, step_cost, greedy)[0] > 0  # the count would see it


def test_the_idle_rule() -> None:
    def rule(streaming: bool, frame_cost: float | None, step_cost: float | None) -> int:
        return idle_steps(
            streaming=streaming,
            frame_cost=frame_cost,
            step_cost=step_cost,
            frame_seconds=0.08,
            most=16,
        )

    assert rule(False, 0.0, None) == 1  # one step first, to measure it
    assert rule(False, 0.0, 0.01) == 4  # half a frame time's worth
    assert rule(False, 0.0, 1.0) == 1  # at least one
    assert rule(True, None, 0.01) == 0  # frames not measured yet
    assert rule(True, 0.02, None) == 0
    assert rule(True, 0.02, 0.01) == 3  # half of the 60 ms frames leave
    assert rule(True, 0.09, 0.01) == 0  # frames leave no room


# --- on the demo model ----------------------------------------------------------------------


@pytest.fixture
def kept(demo_model: VoiceChatModel, tmp_path: Path) -> Iterator[VoiceChatModel]:
    """The demo model keeping its states in a new directory; nothing kept after."""
    assert isinstance(demo_model, KeepsStates)
    demo_model.set_prompt_cache_bytes(1 << 30)
    demo_model.keep_states(tmp_path / "states", 1 << 30, ahead_seed=7, ahead_tokens=0)
    yield demo_model
    demo_model.keep_states(None, 0, ahead_seed=0, ahead_tokens=0)
    demo_model.set_prompt_cache_bytes(1 << 30)


def _restart(model: VoiceChatModel, directory: Path, *, seed: int = 7, tokens: int = 0) -> None:
    """What a new process finds: an empty cache over the same directory."""
    model.keep_states(directory, 1 << 30, ahead_seed=seed, ahead_tokens=tokens)


def _build(model: VoiceChatModel) -> None:
    while model.ahead(5, True).more:
        pass


def test_a_chain_read_from_disk_is_the_built_one_bit_for_bit(
    kept: VoiceChatModel, tmp_path: Path
) -> None:
    """Built ahead to 30 steps and written; after a restart it is read back (a hit, no
    step run), rebuilds mlx-vlm's constructor's voice state at every length, and
    extends on to exactly what one run gives."""
    directory = tmp_path / "states"
    _restart(kept, directory, tokens=30)
    _build(kept)
    figures = kept.prompt_cache_figures()
    assert (figures.voice_chain_tokens, figures.building, figures.disk_writes) == (30, False, 1)

    _restart(kept, directory, tokens=30)
    assert kept.prompt_cache_figures().building
    work = kept.ahead(5, True)
    assert work.steps == 0  # read, not built
    figures = kept.prompt_cache_figures()
    assert (figures.voice_chain_tokens, figures.disk_reads, figures.building) == (30, 1, False)
    chain = kept._prompts._held_chain(7)
    assert isinstance(chain, VoiceChain) and chain.stored_steps == 30
    for steps in (3, 17, 30):
        inner, key = cold_state(kept, 7, steps)
        assert_equal_state(chain, inner, key, steps)
    while chain.steps < 37:
        chain.extend(37)
    inner, key = cold_state(kept, 7, 37)
    assert_equal_state(chain, inner, key, 37)


def test_a_prompt_read_from_disk_opens_as_a_cold_open(kept: VoiceChatModel, tmp_path: Path) -> None:
    """A prompt opened once is written at idle; after a restart its first opening is a
    hit from the files and its frames equal mlx-vlm's constructor's."""
    directory = tmp_path / "states"
    expected = theirs(kept, 3, LONG_PROMPT)
    assert ours(kept, 3, LONG_PROMPT) == expected
    _build(kept)  # the idle writes: the language part and the chain
    assert kept.prompt_cache_figures().disk_writes == 2

    _restart(kept, directory)
    assert ours(kept, 3, LONG_PROMPT) == expected
    figures = kept.prompt_cache_figures()
    assert (figures.hits, figures.misses, figures.disk_reads) == (1, 0, 2)


def test_a_corrupt_file_is_ignored_and_the_open_is_cold_and_exact(
    kept: VoiceChatModel, tmp_path: Path
) -> None:
    directory = tmp_path / "states"
    expected = theirs(kept, 3, LONG_PROMPT)
    ours(kept, 3, LONG_PROMPT)
    _build(kept)
    states = sorted(directory.glob("*.safetensors"))
    assert len(states) == 2
    for path in states:  # one bit of each file's data flipped
        raw = bytearray(path.read_bytes())
        raw[-5] ^= 0x10
        path.write_bytes(bytes(raw))
    _restart(kept, directory)
    assert ours(kept, 3, LONG_PROMPT) == expected
    figures = kept.prompt_cache_figures()
    assert (figures.hits, figures.disk_reads, figures.disk_ignored) == (0, 0, 2)


def test_a_foreign_file_is_ignored(
    kept: VoiceChatModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files of another identity (here another MLX version) moved to where this one's
    would be: their key says whose they are, so they are not used."""
    directory = tmp_path / "states"
    expected = theirs(kept, 3, LONG_PROMPT)
    ours(kept, 3, LONG_PROMPT)
    _build(kept)
    real = kept.state_identity(directory)
    monkeypatch.setattr(kept, "state_identity", lambda _: {**real, "mlx": "another"})
    _restart(kept, directory)
    files = kept._prompts.files
    assert files is not None
    before = StateFiles(directory, 1 << 30, real)
    ids = tuple(prompt_ids(kept.runtime, LONG_PROMPT))
    for name in (_chain_name(3), _language_name(ids)):
        os.replace(before.path(name), files.path(name))
    assert ours(kept, 3, LONG_PROMPT) == expected
    figures = kept.prompt_cache_figures()
    assert (figures.hits, figures.disk_reads, figures.disk_ignored) == (0, 0, 2)


def test_engines_sharing_a_directory_start_at_once(tmp_path: Path, demo_path: Path) -> None:
    """Two processes load the model and build the same chain ahead into one directory
    at once; a third start reads it back and it is what one build gives."""
    import subprocess

    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from realtime.models import load_model
        model = load_model(Path({str(demo_path)!r}))
        model.keep_states(Path(sys.argv[1]), 1 << 30, ahead_seed=7, ahead_tokens=24)
        while model.ahead(4, True).more:
            pass
        figures = model.prompt_cache_figures()
        print(figures.voice_chain_tokens, figures.disk_reads, figures.disk_writes)
        """
    )
    directory = tmp_path / "states"
    env = subprocess_env(tmp_path / "cache")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(directory)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(out.split()[0] == "24" for out in outs)
    third = run_python("-c", script, str(directory), env=env, timeout=300)
    assert third.returncode == 0, third.stderr
    assert third.stdout.split() == ["24", "1", "0"]  # read, nothing built or written
    assert not list(directory.glob(".tmp-*"))


async def test_the_engine_builds_ahead_when_idle_and_health_says_so(
    demo_model: VoiceChatModel, tmp_path: Path
) -> None:
    """After ready the engine builds seed 0's chain to --max-system-prompt-tokens in
    idle slices and writes it; /health shows it; a never-seen prompt then runs only
    its language model's steps and opens as mlx-vlm's constructor does."""
    import trio

    from realtime.launch.server import engine_for
    from realtime.launch.warm import Keeping
    from realtime.limits import Limits
    from realtime.models.base import PromptUse
    from tests.helpers import ahttp, running_server

    limits = Limits(max_system_prompt_tokens=96)
    demo_model.set_prompt_cache_bytes(1 << 30)
    keeping = Keeping(tmp_path / "states", build_ahead=True)
    engine = engine_for(lambda: demo_model, limits, keeping=keeping)
    engine.start()
    try:
        async with running_server(engine, limits=limits) as server:
            with trio.fail_after(300):
                while True:
                    status, body = await ahttp("GET", server.http + "/health")
                    cache = body["prompt_cache"]
                    if cache["voice_chain_tokens"] == 96 and cache["disk_writes"] == 1:
                        break
                    await trio.sleep(0.1)
            assert status == 200 and cache["building"] is False and cache["ahead_seconds"] > 0
        opening = demo_model.begin_session(
            system_prompt=LONG_PROMPT, seed=0, max_streaming_seconds=None
        )
        slices = 1
        while (session := opening.advance()) is None:
            slices += 1
        tokens = demo_model.count_tokens(LONG_PROMPT)
        assert tokens <= 96 and session.prompt_use == PromptUse(tokens=tokens, cached=0)
        assert slices <= tokens // 4 + 3  # language-model steps only, four a slice
        session.cancel()
        assert demo_model.prompt_cache_figures().voice_chain_tokens == 96
    finally:
        engine.shutdown()
        demo_model.keep_states(None, 0, ahead_seed=0, ahead_tokens=0)
        demo_model.set_prompt_cache_bytes(1 << 30)
    assert ours(demo_model, 0, LONG_PROMPT) == theirs(demo_model, 0, LONG_PROMPT)


def test_a_read_whose_client_left_is_finished_when_idle_so_a_retry_hits(
    demo_model: VoiceChatModel,
) -> None:
    """Two openings of new prompts left half way are finished in idle slices (a third
    is over the count and dropped at once); the retry of one is a hit, exact."""
    from tests.models.test_prompt_cache import OTHER_PROMPT

    demo_model.set_prompt_cache_bytes(1 << 30)
    demo_model.keep_states(None, 0, ahead_seed=0, ahead_tokens=8)  # work ahead on
    try:
        for seed in (11, 12, 13):
            opening = demo_model.begin_session(
                system_prompt=LONG_PROMPT if seed != 12 else OTHER_PROMPT,
                seed=seed,
                max_streaming_seconds=None,
            )
            for _ in range(3):
                assert opening.advance() is None
            opening.abandon()
        assert demo_model.prompt_cache_figures().orphans == 2
        _build(demo_model)
        figures = demo_model.prompt_cache_figures()
        assert (figures.orphans, figures.orphans_finished, figures.orphans_dropped) == (0, 2, 0)
        assert figures.ahead_seconds > 0
        assert ours(demo_model, 11, LONG_PROMPT) == theirs(demo_model, 11, LONG_PROMPT)
        assert demo_model.prompt_cache_figures().hits == 1
    finally:
        demo_model.keep_states(None, 0, ahead_seed=0, ahead_tokens=0)
        demo_model.set_prompt_cache_bytes(1 << 30)


def test_the_flags_and_their_environment_settings(tmp_path: Path) -> None:
    from realtime.launch.cli import build_parser
    from realtime.launch.warm import Keeping, keeping_from

    args = build_parser().parse_args(["serve", "--state-cache-dir", "", "--no-build-ahead"])
    assert keeping_from(args.state_cache_dir, args.build_ahead, {}) == Keeping(None, False)
    env = {"REALTIME_STATE_CACHE_DIR": str(tmp_path)}
    assert keeping_from(None, None, env) == Keeping(tmp_path, True)
    assert keeping_from(None, None, {"REALTIME_BUILD_AHEAD": "off"}).build_ahead is False
    default = keeping_from(None, None, {})
    assert default.build_ahead and default.directory is not None
    bad = {**subprocess_env(tmp_path), "REALTIME_BUILD_AHEAD": "maybe"}
    done = run_python("-m", "realtime", "serve", "--port", "0", env=bad)
    assert done.returncode == 2 and "REALTIME_BUILD_AHEAD must be one of" in done.stderr


def test_realtime_serve_builds_ahead_and_a_restart_reads_it(
    demo_cache_dir: Path, tmp_path: Path
) -> None:
    """``realtime serve`` as launched (the demo checkpoint and its turns): the chain is
    built after ready and written to --state-cache-dir; the next start reads it."""
    import time

    from tests.helpers import http, start_realtime_server

    directory = tmp_path / "states"
    args = ("--state-cache-dir", str(directory), "--max-system-prompt-tokens", "24")
    env = {"REALTIME_BUILD_AHEAD": "1"}
    for start in (1, 2):
        with start_realtime_server(*args, env=env, log_dir=tmp_path) as server:
            deadline = time.monotonic() + 240
            while True:
                _, body = http("GET", server.http + "/health")
                cache = body["prompt_cache"]
                built = cache["voice_chain_tokens"] == 24 and not cache["building"]
                if built and (start == 2 or cache["disk_writes"] == 1):
                    break
                assert time.monotonic() < deadline, body
                time.sleep(0.2)
        if start == 2:
            assert (cache["disk_reads"], cache["disk_writes"]) == (1, 0)
    assert len(list(directory.glob("*.safetensors"))) == 1
