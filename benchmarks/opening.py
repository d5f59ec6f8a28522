"""``python -m benchmarks.opening``: what a long system-prompt prefill does to a
conversation already streaming on the same engine.

One session streams paced 80 ms frames through the engine (no sockets: this
measures the engine's scheduling, nothing else) while a second opens with a long
system prompt part way through. Each frame's latency is its submission until its
result; the rows are the frames submitted while the second session opened, and
the frames before it. Run it on two checkouts side by side (``--repeat`` rounds;
alternate them yourself) to compare engines: it uses only the command API that
both the one-command open and the sliced open share.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.stats import summarize

PROMPT_WORDS = (
    "You are a careful assistant for a bicycle repair shop; answer in one or two short "
    "sentences, ask which model the bicycle is when it matters, never invent prices, "
    "and say when a repair needs the workshop. "
)


def _prompt(tokens: int, count: Any) -> str:
    """A prompt of about ``tokens`` prefill steps under the model's own tokenizer."""
    text = PROMPT_WORDS
    while count(text) < tokens:
        text += PROMPT_WORDS
    while count(text) > tokens:
        text = text[: int(len(text) * 0.95)]
    return text


def run_round(size: str, tokens: int, seconds: float, open_at: float) -> dict[str, Any]:
    from realtime.demo.checkpoint import ensure_demo_checkpoint
    from realtime.demo.checkpoint.config import SIZES
    from realtime.engine.commands import Close, Open, Push
    from realtime.engine.facade import Engine
    from realtime.models import load_model

    path = ensure_demo_checkpoint(size=SIZES[size])
    engine = Engine(lambda: load_model(path), capacity=2)
    model = engine.start()
    prompt = _prompt(tokens, model.count_tokens)
    frame = model.figures.frame_seconds
    audio = (np.random.default_rng(1).standard_normal(1280) * 0.05).astype(np.float32)
    try:
        assert engine.try_reserve("a") and engine.try_reserve("b")
        engine.submit(Open("a", None, 1, None)).result(60)
        before: list[float] = []
        during: list[float] = []
        opening: Any = None
        open_started = open_seconds = 0.0
        lock = threading.Lock()
        start = time.perf_counter()
        n = 0
        pending: list[Any] = []
        while time.perf_counter() - start < seconds:
            due = start + n * frame
            time.sleep(max(0.0, due - time.perf_counter()))
            if opening is None and time.perf_counter() - start >= open_at:
                open_started = time.perf_counter()
                opening = engine.submit(Open("b", prompt, 2, None))

                def opened(_: object, t0: float = open_started) -> None:
                    nonlocal open_seconds
                    open_seconds = time.perf_counter() - t0

                opening.add_done_callback(opened)
            submitted = time.perf_counter()
            in_open = opening is not None and not opening.done()
            future = engine.submit(Push("a", audio, 16000))

            def done(_: object, t0: float = submitted, flag: bool = in_open) -> None:
                with lock:
                    (during if flag else before).append(time.perf_counter() - t0)

            future.add_done_callback(done)
            pending.append(future)
            n += 1
        for future in pending:
            future.result(120)
        if opening is not None:
            opening.result(600)
        engine.submit(Close("a")).result(60)
        engine.submit(Close("b")).result(60)
    finally:
        engine.shutdown()
    ms = 1000.0
    return {
        "size": size,
        "prompt_tokens": model.count_tokens(prompt),
        "open_seconds": round(open_seconds, 2),
        "before": {k: round(v * ms, 1) for k, v in summarize(before).to_dict().items() if k != "n"}
        | {"n": len(before)},
        "during_open": {
            k: round(v * ms, 1) for k, v in summarize(during).to_dict().items() if k != "n"
        }
        | {"n": len(during)},
        "late_during_open": sum(1 for x in during if x > 2 * frame),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.opening", description=__doc__)
    parser.add_argument("--size", choices=["tiny", "medium"], default="tiny")
    parser.add_argument("--tokens", type=int, default=512, help="system prompt prefill steps")
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--open-at", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    rounds = [
        run_round(args.size, args.tokens, args.seconds, args.open_at) for _ in range(args.repeat)
    ]
    for r in rounds:
        print(
            f"{r['size']}: {r['prompt_tokens']}-token open took {r['open_seconds']} s; "
            f"the streaming session's frame latency before p50 {r['before']['p50']} ms "
            f"p95 {r['before']['p95']} ms; during the open p50 {r['during_open']['p50']} ms "
            f"p95 {r['during_open']['p95']} max {r['during_open']['max']} ms "
            f"({r['during_open']['n']} frames, {r['late_during_open']} over two frames)"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rounds, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
