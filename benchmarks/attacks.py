"""``python -m benchmarks.attacks``: every finding of the fifth red team (cold prefills,
JSON floods, recordings, the prompt cache, operator files, shutdown) tried again as an
attacker would, through a real server; held or failed per finding, with its figure.

Bounded (a few minutes on the 2-core VM) and reproducible (fixed seeds, prompts and
counts). The servers are real: Hypercorn on 127.0.0.1 serving the demo checkpoint
(loaded once, in this process) or the fake model, or a server process of its own where
the attack is on the process (the JSON flood, warm-prompt files, SIGTERM). The tests
that fail before each fix are listed in docs/reliability.md ("The red team's findings,
tried again"); this replays the attacks for their figures. ``--only 1,4`` runs some.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import trio
from trio_websocket import open_websocket_url

FRAME_SECONDS = 0.08
FRAMES = 75
"""The victim's frames in the fairness attacks (6 s of audio in real time)."""


@attrs.frozen
class Outcome:
    finding: str
    attack: str
    held: bool
    figure: str


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def _demo() -> Any:
    from realtime.demo.checkpoint import ensure_demo_checkpoint
    from realtime.models import load_model

    return load_model(ensure_demo_checkpoint())


# --- 1 and 9: cold openings beside a stream (demo checkpoint) ------------------------


async def victim(url: str, seed: int, frames: int, latencies: list[float] | None) -> None:
    """A client streaming ``frames`` frames in real time; each frame's latency (its
    append sent until its audio arrived) into ``latencies`` (None: not measured)."""
    from tests.helpers import append_msg, connect, noise

    async with connect(url) as client:
        await client.configure(seed=seed)
        sent: list[float] = []
        got: list[float] = [] if latencies is None else latencies

        async def read() -> None:
            while len(got) < frames:
                event = await client.recv(60)
                if event["type"] == "response.audio.delta":
                    got.append(time.perf_counter() - sent[len(got)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            frame = append_msg(noise(1280))
            start = trio.current_time()
            for n in range(frames):
                await trio.sleep_until(start + n * FRAME_SECONDS)
                sent.append(time.perf_counter())
                await client.send(frame)


async def open_cold(url: str, prompt: str, seed: int, stay: float) -> None:
    """A client opening ``prompt`` with ``seed`` (new to the server), leaving once it
    opened or after ``stay`` seconds."""
    from tests.helpers import connect

    async with connect(url) as client:
        assert (await client.recv())["type"] == "session.created"
        session = {"system_prompt": prompt, "seed": seed}
        await client.send({"type": "session.update", "session": session})
        with trio.move_on_after(stay):
            while (await client.recv(120))["type"] != "session.updated":
                pass


async def beside_openings(model: Any, attack: str) -> list[float]:
    """The victim's latencies beside ``attack``: "fair" (a co-tenant streaming), "cold"
    (one client opening a 180-token prompt with a new seed, again and again) or "three"
    (three clients opening 510-token prompts of their own at once)."""
    from benchmarks.opening import _prompt
    from realtime.engine.facade import Engine
    from realtime.limits import Limits
    from tests.helpers import running_server

    engine = Engine(lambda: model, capacity=5, batch_frames=True)
    engine.start()
    latencies: list[float] = []
    prompts = [
        f"{i} "
        + _prompt(510 if attack == "three" else 180, lambda t, i=i: model.count_tokens(f"{i} {t}"))
        for i in range(3 if attack == "three" else 1)
    ]
    try:
        limits = Limits(max_sessions=5, admission_margin=0)
        async with running_server(engine, limits=limits) as server:
            async with trio.open_nursery() as nursery:

                async def attacker() -> None:
                    if attack == "fair":
                        await victim(server.url, 2, FRAMES + 10, None)
                    elif attack == "three":
                        async with trio.open_nursery() as openers:
                            for i, prompt in enumerate(prompts):
                                openers.start_soon(open_cold, server.url, prompt, 1000 + i, 60)
                    else:
                        seed = 2000
                        while True:
                            seed += 1
                            await open_cold(server.url, prompts[0], seed, 1.5)

                nursery.start_soon(attacker)
                await trio.sleep(0.3)
                await victim(server.url, 1, FRAMES, latencies)
                nursery.cancel_scope.cancel()
    finally:
        engine.shutdown()
    return latencies


def _late(latencies: Sequence[float]) -> str:
    late = sum(1 for x in latencies if x > 2 * FRAME_SECONDS)
    return (
        f"p50 {statistics.median(latencies) * 1e3:.0f} ms, p95 {p95(latencies) * 1e3:.0f} ms, "
        f"{late} of {len(latencies)} over two frame times"
    )


async def fairness(model: Any) -> list[Outcome]:
    fair = await beside_openings(model, "fair")
    bound = 2 * p95(fair) + 0.1
    out = []
    for finding, attack, what in (
        ("1", "cold", "one client opening a 180-token prompt with a new seed, again and again"),
        ("9", "three", "three 510-token openings at once"),
    ):
        got = await beside_openings(model, attack)
        out.append(
            Outcome(
                finding,
                f"victim streaming beside {what}",
                p95(got) <= bound,
                f"{_late(got)}; beside a fair stream {_late(fair)}; bound p95 {bound * 1e3:.0f} ms",
            )
        )
    return out


# --- 4 and 6: voice chains within the byte bound, pinned memory (demo checkpoint) ----


async def chains(model: Any) -> list[Outcome]:
    """Clients of six new seeds open a prompt (every other one leaves 50 ms into its
    read) beside the chain built ahead and a warmed prompt; then an OpenAI client whose
    instructions are longer than the warmed ones. /health's bytes against the bound,
    chains held outside the count, pinned bytes."""
    from realtime.launch.server import engine_for
    from realtime.launch.warm import Keeping, WarmPrompt
    from realtime.limits import Limits
    from realtime.models.voicechat.prompt import VoiceChain
    from tests.engine.test_isolation import LONG_PROMPT
    from tests.helpers import ahttp, connect, running_server
    from tests.models.test_prompt_cache import OTHER_PROMPT

    model.set_prompt_cache_bytes(1 << 30)
    opening = model.begin_session(system_prompt=OTHER_PROMPT, seed=99, max_streaming_seconds=None)
    while opening.advance() is None:
        pass
    del opening
    bound = 3 * model.prompt_cache_figures().bytes
    limits = Limits(prompt_cache_bytes=bound, max_system_prompt_tokens=96)
    warm = WarmPrompt("w", session={"type": "realtime", "instructions": "Be brief."})
    engine = engine_for(lambda: model, limits, warm=[warm], keeping=Keeping(None, build_ahead=True))
    engine.start()
    store = model._prompts.store
    most = 0
    outside = 0
    pinned: list[int] = []

    async def look(http: str) -> None:
        nonlocal most, outside
        with trio.fail_after(60):
            while engine.reserved:
                await trio.sleep(0.01)
        _, body = await ahttp("GET", http + "/health")
        cache = body["prompt_cache"]
        most = max(most, cache["bytes"])
        pinned.append(cache["pinned_bytes"])
        # Chains outside the store in two looks 0.2 s apart (one the engine thread
        # is making and keeping in this very slice is not outside).
        first = held_outside()
        await trio.sleep(0.2)
        second = held_outside()
        outside = max(outside, sum(size for key, size in second.items() if key in first))

    def held_outside() -> dict[int, int]:
        gc.collect()
        live = [o for o in gc.get_objects() if isinstance(o, VoiceChain) and not o.failed]
        held = {id(store.peek(key)) for key in store.held()}
        return {id(c): c.nbytes for c in live if id(c) not in held}

    try:
        async with running_server(engine, limits=limits) as server:
            await look(server.http)
            for seed in range(1, 7):
                async with connect(server.url) as client:
                    assert (await client.recv())["type"] == "session.created"
                    prompt = OTHER_PROMPT if seed % 2 else LONG_PROMPT
                    session = {"seed": seed, "system_prompt": prompt}
                    await client.send({"type": "session.update", "session": session})
                    if seed % 2:
                        while (await client.recv(120))["type"] != "session.updated":
                            pass
                    else:
                        await trio.sleep(0.05)
                await look(server.http)
            url = server.http.replace("http://", "ws://") + "/openai/v1/realtime?model=x"
            before = store.figures().misses
            async with open_websocket_url(url) as ws:
                update = {"type": "session.update", "session": {"instructions": LONG_PROMPT}}
                await ws.send_message(json.dumps(update))
                silence = base64.b64encode(bytes(4800)).decode()  # the model opens
                await ws.send_message(
                    json.dumps({"type": "input_audio_buffer.append", "audio": silence})
                )
                with trio.fail_after(120):
                    while store.figures().misses == before or engine.queue_depth:
                        await trio.sleep(0.05)
                    await trio.sleep(0.5)
            await look(server.http)
            evictions = store.figures().evictions
    finally:
        engine.shutdown()
        model.keep_states(None, 0, ahead_seed=0, ahead_tokens=0)
        model.set_prompt_cache_bytes(1 << 30)
    return [
        Outcome(
            "4",
            "six new seeds' reads (three left 50 ms in) beside the chain built ahead",
            most <= bound and outside == 0,
            f"/health bytes at most {most:,} of a {bound:,}-byte bound ({evictions} evicted); "
            f"chains held outside the count: {outside:,} bytes",
        ),
        Outcome(
            "6",
            "an OpenAI client's instructions longer than the warmed prompt",
            len(set(pinned)) == 1,
            f"pinned bytes {pinned[0]:,} before, {pinned[-1]:,} after",
        ),
    ]


# --- 5: the prompt cache as an oracle across tenants (demo checkpoint) ---------------


async def oracle(model: Any) -> list[Outcome]:
    """acme opens a prompt; globex guesses it (right) and guesses another (wrong), three
    rounds each on fresh prompts: how long each guess took to open, whether it was a
    hit, and what /health shows without a key."""
    from realtime.launch.server import engine_for
    from realtime.limits import Limits
    from tests.helpers import ahttp, running_server
    from tests.test_tenants import _open_native, auth, tenants

    model.set_prompt_cache_bytes(1 << 30)
    engine = engine_for(lambda: model, Limits())
    engine.start()
    right: list[float] = []
    wrong: list[float] = []
    hits = 0
    try:
        async with running_server(engine, tenants=tenants()) as server:

            async def opened(key: str, prompt: str) -> float:
                began = time.perf_counter()
                await _open_native(server.http, key, prompt)
                return time.perf_counter() - began

            for n in range(3):
                secret = f"Round {n}: you answer for acme only, in one short sentence."
                await opened("acme-key-1", secret)
                before = model.prompt_cache_figures().hits
                right.append(await opened("globex-key-2", secret))
                hits += model.prompt_cache_figures().hits - before
                wrong.append(await opened("globex-key-2", f"Round {n}: a guess nobody used."))
            status, body = await ahttp("GET", server.http + "/health")
            _, with_key = await ahttp("GET", server.http + "/health", headers=auth("acme-key-1"))
    finally:
        engine.shutdown()
    hidden = status == 401 and "prompt_cache" not in body and "prompt_cache" in with_key
    return [
        Outcome(
            "5",
            "another tenant guessing a prompt by how fast it opens",
            hits == 0 and hidden,
            f"right guesses open in {statistics.median(right) * 1e3:.0f} ms, wrong ones in "
            f"{statistics.median(wrong) * 1e3:.0f} ms (medians of 3), {hits} hits; "
            f"/health without a key: {status}",
        )
    ]


# --- 2: a JSON flood on the native endpoint (its own server process) -----------------


async def flood() -> list[Outcome]:
    from benchmarks.hostile_json import SERVER, beside
    from realtime.testing.servers import start_server_process
    from tests.helpers import REPO

    with start_server_process(argv=[sys.executable, "-c", SERVER], cwd=REPO, name="flood") as s:
        port = urlsplit(s.http).port
        assert port is not None
        alone, _ = await beside(port, False)
        flooded, count = await beside(port, True)
    bound = 2 * p95(alone) + 0.1
    return [
        Outcome(
            "2",
            f"{count} messages of 1.3 M JSON values beside a victim",
            p95(flooded) <= bound,
            f"{_late(flooded)}; alone {_late(alone)}",
        )
    ]


# --- 3 and 7: recordings (fake model) -------------------------------------------------


async def recordings() -> list[Outcome]:
    from realtime.engine.facade import Engine
    from realtime.telemetry.recording import Recording
    from realtime.testing.fake import FakeModel
    from tests.helpers import connect, running_server
    from tests.reliability.test_recording_bounds import junk_beside_recordings

    engine = Engine(FakeModel)
    engine.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            junk = await junk_beside_recordings(engine, Path(tmp, "junk"))
            deep = "[" * 100_000 + "]" * 100_000
            async with running_server(engine) as server:
                server.state.recording = Recording(Path(tmp, "deep"), 10**9)
                async with connect(server.url) as client:
                    assert (await client.recv())["type"] == "session.created"
                    await client.send(deep)
                    refused = (await client.recv())["type"]
                    await client.send({"type": "session.ping"})
                    pong = (await client.recv())["type"]
    finally:
        engine.shutdown()
    return [
        Outcome(
            "3",
            "40 refused 1 MiB messages and 2,000 pings on a recorded session",
            junk.most <= junk.bound and junk.victims_left == 9 and junk.written <= junk.share,
            f"directory at most {junk.most:,} of {junk.bound:,} bytes; "
            f"{junk.victims_left} of 9 other files left; the attacker wrote {junk.written:,} "
            f"of its {junk.share:,}-byte share",
        ),
        Outcome(
            "7",
            "a 100,000-deep message on a recorded session",
            (refused, pong) == ("error", "session.pong"),
            f"answered {refused}, then a ping got {pong}",
        ),
    ]


# --- 8: malformed warm-prompt files (the realtime command) ---------------------------


async def warm_files() -> list[Outcome]:
    from tests.models_fixtures import run_realtime
    from tests.reliability.test_warm_files import deep_json, huge_text, not_a_string

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, make in (
            ("deep.json", deep_json),
            ("huge.txt", huge_text),
            ("session.json", not_a_string),
        ):
            path = Path(tmp, name)
            make(path)
            args = ("--log-level", "error", "serve", "--port", "0", "--warm-prompt", str(path))
            done = await trio.to_thread.run_sync(partial(run_realtime, Path(tmp), *args))
            lines = done.stderr.strip().splitlines()
            ok = done.returncode == 2 and len(lines) == 1 and "terminate called" not in done.stderr
            results.append((name, done.returncode, len(lines), ok))
    return [
        Outcome(
            "8",
            "a 100,000-deep JSON file, a 64 MB text file, instructions that are not a string",
            all(ok for *_, ok in results),
            "; ".join(f"{name}: exit {code}, {lines} line(s)" for name, code, lines, _ in results),
        )
    ]


# --- 9: /ready while the admitted fall behind; SIGTERM beside a non-reader -----------


async def ready_and_shutdown() -> list[Outcome]:
    from realtime.engine.facade import Engine
    from realtime.limits import Limits
    from realtime.testing.fake import FakeModel, FakeOptions
    from tests.helpers import ahttp, connect, running_server
    from tests.reliability.test_fair_share import stream
    from tests.reliability.test_shutdown import sigterm_beside_a_non_reader

    model = FakeModel(FakeOptions(frame_delay=0.1))
    engine = Engine(lambda: model, capacity=4, admission_margin=0.75)
    engine.start()
    samples: list[int] = []
    try:
        async with running_server(engine, limits=Limits(max_sessions=4)) as server:
            async with connect(server.url) as held:
                await held.configure()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream, server.url, 24)
                    await trio.sleep(1.0)
                    for _ in range(12):
                        samples.append((await ahttp("GET", server.http + "/ready"))[0])
                        await trio.sleep(0.05)
    finally:
        engine.shutdown()
    code, closes, elapsed, _ = await sigterm_beside_a_non_reader()
    return [
        Outcome(
            "9",
            "/ready while conversations' frames take 100 ms against an 80 ms frame",
            samples.count(200) <= 1,
            f"/ready 200 in {samples.count(200)} of {len(samples)} samples",
        ),
        Outcome(
            "9",
            "SIGTERM with three streams and a client that stopped reading (bound 5 s)",
            code == 0 and elapsed < 5.0 and closes == [1001, 1001, 1001],
            f"exit {code} after {elapsed:.2f} s; streams closed {[c and int(c) for c in closes]}",
        ),
    ]


ATTACKS: dict[str, Callable[[Any], Awaitable[list[Outcome]]]] = {
    "1,9": fairness,
    "4,6": chains,
    "5": oracle,
    "2": lambda _: flood(),
    "3,7": lambda _: recordings(),
    "8": lambda _: warm_files(),
    "9b": lambda _: ready_and_shutdown(),
}


async def run(only: set[str] | None) -> list[Outcome]:
    model: Any = None
    outcomes: list[Outcome] = []
    for findings, attack in ATTACKS.items():
        if only is not None and not only & set(findings.rstrip("b").split(",")):
            continue
        if attack in (fairness, chains, oracle) and model is None:
            model = _demo()
        began = time.perf_counter()
        try:
            got = await attack(model)
        except Exception as exc:  # an attack that broke the server or the run: failed
            got = [Outcome(findings, "the attack run", False, f"{type(exc).__name__}: {exc}")]
        for outcome in got:
            print(
                f"finding {outcome.finding}: {'held' if outcome.held else 'FAILED'}: "
                f"{outcome.attack}: {outcome.figure} ({time.perf_counter() - began:.0f} s)",
                flush=True,
            )
        outcomes += got
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attacks", description=__doc__)
    parser.add_argument("--only", help="findings to run, e.g. 1,4 (default: all)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    only = None if args.only is None else set(args.only.split(","))
    outcomes = trio.run(run, only)
    print("\n| finding | attack | held | figure |\n|---|---|---|---|")
    for o in outcomes:
        print(f"| {o.finding} | {o.attack} | {'held' if o.held else 'FAILED'} | {o.figure} |")
    if args.json:
        Path(args.json).write_text(json.dumps([attrs.asdict(o) for o in outcomes], indent=2))
    return 0 if all(o.held for o in outcomes) else 1


if __name__ == "__main__":
    from realtime.launch.server import exit_skipping_native_teardown

    # MLX ran off the main thread: its static destructors may abort at exit.
    exit_skipping_native_teardown(main())
