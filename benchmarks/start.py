"""``python -m benchmarks.start``: session start, ``session.update`` to ``session.updated``.

For system prompts of 0, 50, 200 and the most tokens this server accepts
(``--max-system-prompt-tokens``, default 512; counted as the model counts them:
its tokens plus BOS and EOS), on this server and on mlx-vlm's, alternating the
two servers round by round, each prompt ``--repeats`` times per round; medians.
Opening a session seeds, warms the TTS voice prompt, then prefills the prompt
one full model step per token, so the slope is the per-token cost.

``--states`` measures the prompt-state cache in this process; ``--second-start``, side
by side in one run: a fresh server (a new process on an empty state directory) whose
first session opens a never-seen ~4,000-character prompt, a first start that builds the
voice chain ahead and writes it, then a second start (a new process on that state
directory) opening another never-seen prompt; with ``--prefill sequence`` also a second
start whose openings read prompts in sequence (``realtime serve --prefill``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import trio

from benchmarks import servers
from benchmarks.common import model_path, write_json
from benchmarks.wire import CANCEL, connect

DEFAULT_TOKENS: Final = (0, 50, 200, 512)
WORDS: Final = tuple(
    [
        "please",
        "answer",
        "briefly",
        "and",
        "kindly",
        "while",
        "we",
        "talk",
        "about",
        "the",
        "weather",
        "today",
    ]
)


@functools.cache
def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def prompt_of_count(path: Path, text: str) -> int:
    """Prefill steps of ``text`` as VoiceChatModel.count_tokens counts them: ids + BOS + EOS."""
    return len(_tokenizer(path).encode(text, add_special_tokens=False)) + 2


def prompt_of(path: Path, tokens: int) -> str:
    """A prompt that the model counts as exactly ``tokens`` prefill steps (0: none)."""
    if tokens == 0:
        return ""

    def count(text: str) -> int:
        return prompt_of_count(path, text)

    words: list[str] = []
    while count(" ".join(words)) < tokens:
        words.append(WORDS[len(words) % len(WORDS)])
    while words and count(" ".join(words)) > tokens:
        words.pop()
    text = " ".join(words)
    filler = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while count(text) < tokens:  # top up one character at a time
        text += filler[i % len(filler)]
        i += 1
    if count(text) != tokens:
        raise ValueError(f"cannot build a prompt of exactly {tokens} tokens")
    return text


async def _open_times(
    url: str, model: str | None, prompts: dict[int, str], repeats: int
) -> dict[int, list[float]]:
    from realtime.client import session_update_message

    out: dict[int, list[float]] = {n: [] for n in prompts}
    for _ in range(repeats):
        for n, prompt in prompts.items():
            async with connect(url, model) as client:
                message = session_update_message(model=model, system_prompt=prompt or None)
                sent = await client.send(message)
                with trio.fail_after(600):
                    while True:
                        at, event = await client.recv()
                        if event.get("type") == "session.updated":
                            out[n].append((at - sent) * 1e3)
                            break
                        if event.get("type") == "error":
                            raise RuntimeError(f"{url}: {event}")
                await client.send(CANCEL)
                await client.drain_until("response.cancelled", 60)
    return out


def run(path: Path, tokens: Sequence[int], rounds: int, repeats: int, peer: bool) -> dict[str, Any]:
    prompts = {n: prompt_of(path, n) for n in tokens}
    sides = ["ours", "peer"] if peer else ["ours"]
    times: dict[str, dict[int, list[float]]] = {s: {n: [] for n in tokens} for s in sides}
    for round_ in range(rounds):
        for side in sides:
            print(f"start: round {round_ + 1}/{rounds}, {side}", file=sys.stderr, flush=True)
            launch = servers.ours(path) if side == "ours" else servers.peer(path)
            model = None if side == "ours" else str(path)
            with launch as server:
                # One warm session first (mlx-vlm loads the model on the first update).
                trio.run(_open_times, server.url, model, {0: ""}, 1)
                got = trio.run(_open_times, server.url, model, prompts, repeats)
            for n, values in got.items():
                times[side][n] += values
    result: dict[str, Any] = {"tokens": list(tokens), "rounds": rounds, "repeats": repeats}
    for side in sides:
        medians = {n: statistics.median(v) for n, v in times[side].items()}
        result[side] = {"open_ms_p50": medians, "open_ms_all": times[side]}
        big, small = max(tokens), min(tokens)
        if big > small:
            result[side]["per_token_ms"] = (medians[big] - medians[small]) / (big - small)
    return result


# --- in process: the prompt-state cache (--states) ---------------------------------------

STATE_TOKENS: Final = (0, 128, 512, 2048, 4096)


def _timed(call: Any) -> tuple[float, Any]:
    began = time.perf_counter()
    value = call()
    return time.perf_counter() - began, value


def _frame_step(model: Any) -> float:
    """The median unpaced frame step of one session alone (seconds)."""
    import numpy as np

    from realtime.models.base import open_session

    session = open_session(model, system_prompt="", seed=0, max_streaming_seconds=None)
    frame = np.zeros(model.figures.frame_samples, dtype=np.float32)
    times = [_timed(lambda: session.push_audio(frame, 16000))[0] for _ in range(24)]
    session.cancel()
    return statistics.median(times[4:])


def states(path: Path, tokens: Sequence[int], peer: bool) -> dict[str, Any]:
    """Open times by prompt length on the model itself (no sockets): cold (nothing
    stored: the seed's voice chain and the language model's steps), cached (the same
    prompt again), warmed (opened after ``prepare_model``), a new prompt once the seed's
    chain is as long (``voice_stored``: its language-model steps alone, what any new
    prompt costs), and mlx-vlm's own constructor; the bytes a stored prompt holds."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.launch.warm import WarmPrompt, prepare_model
    from realtime.limits import Limits
    from realtime.models import load_model
    from realtime.models.base import open_session

    model: Any = load_model(path)
    frame = _frame_step(model)
    rows: list[dict[str, Any]] = []

    def open_(prompt: str, seed: int) -> float:
        seconds, session = _timed(
            lambda: open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=None)
        )
        session.cancel()
        return seconds

    for n in tokens:
        prompt, other = prompt_of(path, n), _other_prompt(path, n)
        print(f"start --states: {n} tokens", file=sys.stderr, flush=True)
        model.set_prompt_cache_bytes(1 << 40)
        row: dict[str, Any] = {"tokens": n, "cold_s": open_(prompt, 1)}
        row["bytes"] = model.prompt_cache_figures().bytes
        row["cached_s"] = open_(prompt, 1)
        row["voice_stored_s"] = open_(other, 1) if other is not None else None
        model.set_prompt_cache_bytes(1 << 40)
        prepare_model(model, Limits(prompt_cache_bytes=1 << 40), [WarmPrompt("b", text=prompt)])
        row["warmed_s"] = open_(prompt, 0)
        if peer:
            row["mlx_vlm_s"] = _timed(
                functools.partial(
                    VoiceChatStreamingSession, model.runtime, system_prompt=prompt, seed=1
                )
            )[0]
        if n:
            row["cold_per_token_frames"] = row["cold_s"] / n / frame
            if peer:
                row["mlx_vlm_per_token_frames"] = row["mlx_vlm_s"] / n / frame
            if row["voice_stored_s"] is not None:
                row["voice_stored_per_token_frames"] = row["voice_stored_s"] / n / frame
            row["bytes_per_token"] = row["bytes"] / n
        rows.append(row)
    model.set_prompt_cache_bytes(0)
    return {"frame_step_s": frame, "rows": rows}


def _other_prompt(path: Path, tokens: int) -> str | None:
    """Another prompt of exactly ``tokens`` prefill steps (``None`` for 0)."""
    if tokens == 0:
        return None
    text = prompt_of(path, tokens)
    for i, ch in enumerate(text):
        if ch.isalpha():
            swapped = text[:i] + ("b" if ch != "b" else "c") + text[i + 1 :]
            try:
                if prompt_of_count(path, swapped) == tokens:
                    return swapped
            except ValueError:
                continue
    return None


# --- across a restart (--second-start) -------------------------------------------------

SECOND_START_CHARS: Final = 4000


def never_seen_prompt(chars: int, salt: int) -> str:
    """About ``chars`` characters of instructions no run has seen (``salt`` in it)."""
    words: list[str] = [f"Assistant {salt}:"]
    i = 0
    while len(" ".join(words)) < chars:
        words.append(WORDS[(i * 7 + salt) % len(WORDS)])
        i += 1
    return " ".join(words)[:chars]


def _phase(
    path: Path, directory: Path, phase: str, ahead: int, chars: int, prefill: str = "step"
) -> dict[str, Any]:
    """One process's part: ``fresh`` (a fresh server, nothing on disk: its first session
    opens a never-seen prompt of ``chars`` characters at once, extending the seed's chain
    as it reads), ``build`` (a first start: build seed 0's chain ahead to ``ahead``
    steps at idle and write it) or ``open`` (a second start: read what the first left,
    then open a never-seen prompt of ``chars`` characters); openings read prompts as
    ``prefill`` says (``--prefill``)."""
    from realtime.models import load_model
    from realtime.models.prompt_cache import prefill_read_from

    began = time.perf_counter()
    model: Any = load_model(path, prefill=prefill_read_from(prefill))
    model.keep_states(directory, 1 << 40, ahead_seed=0, ahead_tokens=ahead)
    if phase == "build":
        while model.ahead(16, True).more:
            pass
        figures = model.prompt_cache_figures()
        return {
            "build_s": time.perf_counter() - began,
            "voice_chain_tokens": figures.voice_chain_tokens,
            "ahead_seconds": figures.ahead_seconds,
            "files_bytes": sum(p.stat().st_size for p in directory.glob("*.safetensors")),
        }
    from realtime.models.base import open_session

    read_s = 0.0
    if phase == "open":  # the first idle slice reads the chain
        read_s = _timed(lambda: model.ahead(16, True))[0]
    ready_s = time.perf_counter() - began  # loaded (and the chain read back)
    prompt = never_seen_prompt(chars, time.time_ns() % 10**9)
    tokens = model.count_tokens(prompt)
    seconds, session = _timed(
        lambda: open_session(model, system_prompt=prompt, seed=0, max_streaming_seconds=None)
    )
    session.cancel()
    frame = _frame_step(model)
    figures = model.prompt_cache_figures()
    return {
        "chars": len(prompt),
        "tokens": tokens,
        "load_and_read_s": ready_s,
        "chain_read_s": read_s,
        "open_s": seconds,
        "frame_step_s": frame,
        "per_token_frames": seconds / tokens / frame,
        "voice_chain_tokens": figures.voice_chain_tokens,
        "disk_reads": figures.disk_reads,
        "prefill": prefill,
    }


def second_start(path: Path, ahead: int, chars: int, prefill: str = "step") -> dict[str, Any]:
    """Side by side: a fresh server's first session of a never-seen prompt (an empty
    state directory of its own), a first start that builds ahead, then a second start (a
    new process on the same state directory) opening a never-seen prompt (and, with
    ``prefill`` other than step, a second start reading in sequence); each in a process
    of its own."""
    import subprocess
    import tempfile

    phases = [("fresh", "fresh", "step"), ("build", "build", "step"), ("open", "open", "step")]
    if prefill != "step":
        phases.append(("open_sequence", "open", prefill))
    with (
        tempfile.TemporaryDirectory(prefix="realtime-states-") as directory,
        tempfile.TemporaryDirectory(prefix="realtime-fresh-") as empty,
    ):
        rows: dict[str, Any] = {}
        for row, phase, read in phases:
            print(f"start --second-start: {row}", file=sys.stderr, flush=True)
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.start",
                    "--model",
                    str(path),
                    "--phase",
                    phase,
                    "--state-dir",
                    empty if phase == "fresh" else directory,
                    "--ahead",
                    str(ahead),
                    "--chars",
                    str(chars),
                    "--prefill",
                    read,
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rows[row] = json.loads(done.stdout.strip().splitlines()[-1])
    return {"ahead": ahead, **rows}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.start", description=__doc__)
    parser.add_argument("--model", type=Path, help="checkpoint folder (default: the demo one)")
    parser.add_argument("--size", choices=["tiny", "medium"], default="tiny")
    parser.add_argument(
        "--tokens",
        type=lambda t: tuple(int(x) for x in t.split(",")),
        default=DEFAULT_TOKENS,
        help="prompt lengths in prefill tokens (default 0,50,200,512)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--states",
        action="store_true",
        help="measure opening on the model in this process instead (the prompt-state "
        "cache: cold, cached, warmed, voice part stored, mlx-vlm's constructor; default "
        "tokens 0,128,512,2048,4096)",
    )
    parser.add_argument(
        "--second-start",
        action="store_true",
        help="side by side: a fresh server's first session of a never-seen prompt of "
        "--chars characters, a first start that builds seed 0's voice chain ahead (to "
        "--ahead steps) and writes it, then a second start (a new process) opening "
        "another never-seen prompt: each opening's cost a token in frame steps",
    )
    parser.add_argument(
        "--prefill",
        default="step",
        metavar="step|sequence[:N]",
        help="with --second-start: also a second start reading in sequence (default step)",
    )
    parser.add_argument("--ahead", type=int, default=4096, help="(default %(default)s)")
    parser.add_argument("--chars", type=int, default=SECOND_START_CHARS)
    parser.add_argument("--phase", choices=["fresh", "build", "open"], help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    path = model_path(args)
    started = time.perf_counter()
    if args.phase is not None:
        part = _phase(path, args.state_dir, args.phase, args.ahead, args.chars, args.prefill)
        print(json.dumps(part))
        return 0
    if args.second_start:
        result = second_start(path, args.ahead, args.chars, args.prefill)
        result["model"] = str(path)
        result["seconds"] = time.perf_counter() - started
        print(json.dumps(result))
        write_json(args.json, result)
        return 0
    if args.states:
        tokens = STATE_TOKENS if args.tokens == DEFAULT_TOKENS else args.tokens
        result = states(path, tokens, not args.no_peer)
        result["model"] = str(path)
        result["seconds"] = time.perf_counter() - started
        print(f"frame step {result['frame_step_s'] * 1e3:.1f} ms")
        for row in result["rows"]:
            print(json.dumps(row))
        write_json(args.json, result)
        return 0
    result = run(path, args.tokens, args.rounds, args.repeats, not args.no_peer)
    result["model"] = str(path)
    result["seconds"] = time.perf_counter() - started
    for side in ("ours", "peer"):
        if side in result:
            figures = ", ".join(f"{n}: {v:.0f}" for n, v in result[side]["open_ms_p50"].items())
            slope = result[side].get("per_token_ms")
            print(f"{side}: open ms p50 by prompt tokens {figures}; per token {slope:.2f} ms")
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
