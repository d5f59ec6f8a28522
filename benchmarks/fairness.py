"""``python -m benchmarks.fairness``: a conversation streaming in real time beside
clients opening cold prompts at once, against the same beside a fair co-tenant.

One session streams paced frames through the engine
(no sockets: the engine's scheduling only) while ``--openers`` sessions open long
prompts, each new to the engine (its own text and seed, a fresh engine each round, so
every slice is a cold prefill's); the fair round streams a second session instead.
Each frame's latency is its submission until its result, for the frames submitted
once the others started. Rounds alternate fair and openers; run it on two checkouts
to compare engines (it uses only the command API every recent engine has).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.opening import _prompt
from benchmarks.stats import summarize


def run_round(
    size: str, tokens: int, openers: int, seconds: float, backlog: int = 0
) -> dict[str, Any]:
    """One round on a fresh engine: ``openers`` cold openings (0: a fair co-tenant);
    ``backlog`` frames of the victim handed over at once as the others start (a stream
    that stalled for a moment and catches up)."""
    from realtime.demo.checkpoint import ensure_demo_checkpoint
    from realtime.demo.checkpoint.config import SIZES
    from realtime.engine.commands import Close, Open, Push
    from realtime.engine.facade import Engine
    from realtime.models import load_model

    path = ensure_demo_checkpoint(size=SIZES[size])
    capacity = openers + 2
    engine = Engine(lambda: load_model(path), capacity=capacity, batch_frames=True)
    model = engine.start()
    frame = model.figures.frame_seconds
    audio = (np.random.default_rng(1).standard_normal(1280) * 0.05).astype(np.float32)
    latencies: list[float] = []
    lock = threading.Lock()
    others = [f"o{i}" for i in range(openers)] if openers else ["fair"]
    prompts = [  # tokenized before the stream starts: its pacing must not wait for them
        f"{i} " + _prompt(tokens, lambda t, i=i: model.count_tokens(f"{i} {t}"))
        for i in range(openers)
    ]
    try:
        for sid in ["victim", *others]:
            assert engine.try_reserve(sid)
        engine.submit(Open("victim", None, 1, None)).result(60)
        if not openers:
            engine.submit(Open("fair", None, 2, None)).result(60)
        start = time.perf_counter()
        pending: list[Any] = []
        openings: list[Any] = []
        begun = False
        n = 0
        while time.perf_counter() - start < seconds + 1.0:
            due = start + n * frame
            time.sleep(max(0.0, due - time.perf_counter()))
            if not begun and time.perf_counter() - start >= 1.0:
                begun = True
                for i, prompt in enumerate(prompts):
                    openings.append(engine.submit(Open(others[i], prompt, 10 + i, None)))
                pending += [engine.submit(Push("victim", audio, 16000)) for _ in range(backlog)]
            if begun and not openers:
                pending.append(engine.submit(Push("fair", audio, 16000)))
            submitted = time.perf_counter()
            future = engine.submit(Push("victim", audio, 16000))
            if begun:

                def done(_: object, t0: float = submitted) -> None:
                    with lock:
                        latencies.append(time.perf_counter() - t0)

                future.add_done_callback(done)
            pending.append(future)
            n += 1
        for future in pending:
            future.result(300)
        opened = sum(1 for f in openings if f.done() and f.exception() is None)
        for sid in ["victim", *others]:
            engine.submit(Close(sid)).result(300)
    finally:
        engine.shutdown()
    stats = summarize(latencies)
    return {
        "size": size,
        "openers": openers,
        "prompt_tokens": tokens if openers else 0,
        "backlog": backlog,
        "frames": len(latencies),
        "latency_ms": {"p50": round(stats.p50 * 1e3, 1), "p95": round(stats.p95 * 1e3, 1)},
        "over_two_frames": sum(1 for x in latencies if x > 2 * frame),
        "opened": opened,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fairness", description=__doc__)
    parser.add_argument("--size", choices=["tiny", "medium"], default="tiny")
    parser.add_argument("--tokens", type=int, default=510, help="each opening's prompt tokens")
    parser.add_argument("--openers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0, help="victim frames measured")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of (fair, openers)")
    parser.add_argument(
        "--backlog", type=int, default=0, help="victim frames handed over at once as they start"
    )
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    rounds = []
    for _ in range(args.repeat):
        for openers in (0, args.openers):
            r = run_round(args.size, args.tokens, openers, args.seconds, args.backlog)
            rounds.append(r)
            beside = f"{openers} cold {args.tokens}-token openings" if openers else "a fair stream"
            print(
                f"{r['size']}: victim beside {beside}: p50 {r['latency_ms']['p50']} ms "
                f"p95 {r['latency_ms']['p95']} ms, {r['over_two_frames']} of {r['frames']} "
                f"frames over two frame times; {r['opened']} opened",
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rounds, out, indent=2)
    return 0


if __name__ == "__main__":
    from realtime.launch.server import exit_skipping_native_teardown

    # MLX ran off the main thread: its static destructors may abort at exit.
    exit_skipping_native_teardown(main())
