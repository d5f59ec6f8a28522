"""``python -m benchmarks.prefill``: the sequence prefill (``--prefill sequence``) against
the step read (the default), in three parts.

- **difference** (``--difference``): ``--prompts`` different system prompts (seed 0,
  each with its own noise input), each opened once by each read and run ``--frames``
  frames after its prompt, all of them rows of one batched step (both reads of a prompt
  under the same conditions); per prompt, how many frames' text token, function token
  and audio codes differ between the two reads, and the first frame that differs.
- **speed** (``--speed``): the language-model part of a prompt of each of ``--tokens``
  lengths read by each read (the voice part is the seed's voice chain either way, built
  ahead), in ``--rounds`` alternating rounds: the median seconds, their spread, the
  speed-up. ``--step-tail N``: for lengths over N, the step read times only its last N
  tokens (after a sequence read of the rest) and its whole is estimated from that and
  its first N tokens (a step costs more as the attention cache grows), said so.
- **graph** (``--graph``): exact graph terms per prompt token of each read (waits:
  ``mx.eval`` calls that had work to run; compute nodes: the evaluated graphs'
  primitives other than views), read from the graphs as :mod:`benchmarks.graph` reads a
  frame step, for estimating what each read costs on an accelerator.

``--slices 16,64``: the milliseconds one slice takes, the step read's (four tokens) and
the sequence read's at each chunk (a conversation streaming beside an opening may wait
behind one slice).

``--cpu-blas`` chooses MLX's CPU BLAS before MLX loads (the sequence read's gain on a
CPU depends on it: MLX's bundled reference BLAS costs the same a row however many rows a
multiply has). Figures are from whatever machine runs it: say how loaded it was.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

DEFAULT_TOKENS: Final = (512, 4096, 16384)
BASE_PROMPT: Final = (
    "You are a support agent for a regional train operator. Answer in one or two short "
    "sentences, ask for the booking reference before changing a ticket, never promise "
    "refunds, and hand over to a person when the caller asks for one. "
)
TOPICS: Final = (
    "bicycles on board",
    "delays",
    "season tickets",
    "lost property",
    "accessibility help",
    "group bookings",
    "night trains",
    "pets",
    "luggage limits",
    "seat reservations",
)


def prompt_text(index: int) -> str:
    """Prompt ``index`` of the difference run: the base text, a topic and a length
    of its own (about 60 to 250 demo tokens)."""
    topic = TOPICS[index % len(TOPICS)]
    extra = f"Callers today ask most about {topic}; rule {index}: be exact. " * (1 + index % 7)
    return BASE_PROMPT + extra


def long_ids(runtime: Any, tokens: int) -> tuple[int, ...]:
    """A prompt of exactly ``tokens`` prefill tokens (BOS, text, EOS)."""
    from realtime.models.voicechat.prompt import prompt_ids

    text = BASE_PROMPT
    while len(prompt_ids(runtime, text)) < tokens:
        text += BASE_PROMPT
    ids = prompt_ids(runtime, text)
    return (*ids[: tokens - 1], ids[-1])


def _read(model: Any, read: Any) -> None:
    """Point ``model``'s openings at ``read`` (its cache keeps both reads apart, and the
    seed's voice chain is shared)."""
    model._prompts.read = read


# --- difference ----------------------------------------------------------------------


def difference(model: Any, read: Any, prompts: int, frames: int) -> dict[str, Any]:
    """Both reads of ``prompts`` prompts, ``frames`` frames each: each read's sessions
    one batch (prompt ``i`` row ``i`` of both, so a row's every multiply has the same
    shapes in both and only the prompt state differs), the two batches stepped in turn."""
    from benchmarks.graph import noise_audio
    from realtime.models.base import AudioDelta, open_session
    from realtime.models.prompt_cache import STEP_READ

    batches: dict[str, list[Any]] = {}
    for which, how in (("step", STEP_READ), ("sequence", read)):
        _read(model, how)
        batches[which] = [
            open_session(
                model, system_prompt=prompt_text(index), seed=0, max_streaming_seconds=None
            )
            for index in range(prompts)
        ]
    _read(model, STEP_READ)
    audio = [noise_audio(100 + index, frames) for index in range(prompts)]
    codes: dict[tuple[int, str], dict[int, tuple[int, ...]]] = {}
    frame = model.figures.frame_samples
    for t in range(frames):
        for which, sessions in batches.items():
            batch = [
                (s, audio[i][t * frame : (t + 1) * frame], 16000) for i, s in enumerate(sessions)
            ]
            for index, result in enumerate(model.step(batch)):
                if isinstance(result, Exception):
                    raise result
                for event in result:
                    if isinstance(event, AudioDelta) and event.audio_codes is not None:
                        held = codes.setdefault((index, which), {})
                        held[event.frame_index] = tuple(int(c) for c in event.audio_codes)
    out = []
    for index in range(prompts):
        pair = {which: sessions[index] for which, sessions in batches.items()}
        tokens = model.count_tokens(prompt_text(index))
        channels: dict[str, Any] = {}
        for name in ("text", "function"):
            a = list(getattr(pair["step"]._inner, f"_{name}_tokens")[tokens:])
            b = list(getattr(pair["sequence"]._inner, f"_{name}_tokens")[tokens:])
            channels[name] = _compare(a, b)
        mine, theirs = codes.get((index, "step"), {}), codes.get((index, "sequence"), {})
        keys = sorted(set(mine) | set(theirs))
        channels["audio_codes"] = _compare(
            [mine.get(k) for k in keys], [theirs.get(k) for k in keys], keys
        )
        out.append({"prompt": index, "tokens": tokens, **channels})
    figures = model.prompt_cache_figures()
    return {
        "prompts": prompts,
        "frames": frames,
        "misses": figures.misses,  # both reads of every prompt read it: 2 x prompts
        "hits": figures.hits,
        "rows": out,
    }


def _compare(
    a: Sequence[Any], b: Sequence[Any], keys: Sequence[int] | None = None
) -> dict[str, Any]:
    """How many positions differ and the first that does (a frame index, counted from
    the first frame after the prompt), of ``n`` compared."""
    n = max(len(a), len(b))
    differs = [
        k for k in range(n) if (a[k] if k < len(a) else None) != (b[k] if k < len(b) else None)
    ]
    first = differs[0] if differs else None
    if first is not None and keys is not None:
        first = keys[first] - keys[0]
    return {"n": n, "differ": len(differs), "first": first}


# --- speed ---------------------------------------------------------------------------


def _language(
    runtime: Any,
    ids: tuple[int, ...],
    read: Any,
    start: int = 0,
    cache: Any = None,
    around: Any = None,
) -> tuple[float, Any]:
    """Seconds to read ``ids[start:]``'s language part by ``read`` through the prefill's
    own code (:class:`realtime.models.voicechat.prompt.Prefill`), onto ``cache`` (a new
    one when None); the cache after. ``around``: a context the reading runs in (only
    the reading: the embeddings are evaluated before it)."""
    import contextlib

    import mlx.core as mx

    from realtime.models.voicechat.prompt import Prefill, PromptStates

    prefill = Prefill(runtime, ids, 0, PromptStates(0, read=read))
    stt = runtime.model.stt_model
    prefill._cache = stt.make_cache() if cache is None else cache
    prefill._embeds = stt.embed_tokens(mx.array([list(ids)], dtype=mx.int32))
    mx.eval(prefill._embeds)
    prefill._next = start
    began = time.perf_counter()
    with contextlib.nullcontext() if around is None else around:
        while prefill._next < len(ids):
            prefill._language_steps()
    return time.perf_counter() - began, prefill._cache


def speed(
    model: Any, read: Any, lengths: Sequence[int], rounds: int, tail: int
) -> list[dict[str, Any]]:
    from realtime.models.prompt_cache import STEP_READ

    runtime = model.runtime
    out = []
    for tokens in lengths:
        ids = long_ids(runtime, tokens)
        steps: list[float] = []
        sequences: list[float] = []
        estimated = tail > 0 and tokens > tail
        for _ in range(rounds):
            if estimated:
                first, _ = _language(runtime, ids[:tail], STEP_READ)
                _, cache = _language(runtime, ids[: tokens - tail], read)
                last, _ = _language(runtime, ids, STEP_READ, tokens - tail, cache)
                steps.append((first + last) / 2 / tail * tokens)
            else:
                steps.append(_language(runtime, ids, STEP_READ)[0])
            sequences.append(_language(runtime, ids, read)[0])
        out.append(
            {
                "tokens": tokens,
                "step_s": _spread(steps),
                "sequence_s": _spread(sequences),
                "speedup": statistics.median(steps) / statistics.median(sequences),
                "step_estimated_from_tail": tail if estimated else None,
            }
        )
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


def _spread(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": list(values),
    }


# --- slice costs ----------------------------------------------------------------------


def slice_costs(model: Any, chunks: Sequence[int], tokens: int) -> list[dict[str, Any]]:
    """Milliseconds a slice of each read takes (a ``tokens``-token prompt's language part
    read whole, divided by its slices): the step read's (four steps a slice) and the
    sequence read's at each chunk, the measure of how long a conversation streaming
    beside an opening may wait behind one slice."""
    from realtime.models.prompt_cache import STEP_READ, PrefillRead
    from realtime.models.voicechat.prompt import STEPS_PER_SLICE

    ids = long_ids(model.runtime, tokens)
    reads = [("step", STEP_READ, STEPS_PER_SLICE)]
    reads += [(f"sequence:{c}", PrefillRead("sequence", c), c) for c in chunks]
    out = []
    for name, how, per in reads:
        seconds = _language(model.runtime, ids, how)[0]
        slices = -(-tokens // per)
        out.append({"read": name, "slice_ms": 1000 * seconds / slices, "seconds": seconds})
        print(json.dumps(out[-1]), file=sys.stderr, flush=True)
    return out


# --- graph terms ---------------------------------------------------------------------


def graph_terms(model: Any, read: Any, tokens: int) -> dict[str, Any]:
    """Waits and compute nodes per prompt token of each read's language part."""
    from benchmarks.graph import Probe, named_weights, probing
    from realtime.models.prompt_cache import STEP_READ

    ids = long_ids(model.runtime, tokens)
    out: dict[str, Any] = {"tokens": tokens}
    for name, how in (("step", STEP_READ), ("sequence", read)):
        probe = Probe(named_weights(model), graphs=True)
        _language(model.runtime, ids, how, around=probing(probe))
        out[name] = {
            "waits_per_token": probe.waits / tokens,
            "compute_per_token": probe.counts.compute / tokens,
            "views_per_token": probe.counts.views / tokens,
            "weight_mb_per_token": probe.counts.weight_bytes / tokens / 1e6,
        }
    return out


# --- the command ---------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas, got {text!r}"
        ) from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError("each length is at least 2 tokens")
    return values


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.common import checkpoint_parser

    parser = checkpoint_parser("benchmarks.prefill", __doc__)
    parser.add_argument("--difference", action="store_true")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--graph", action="store_true")
    parser.add_argument(
        "--slices",
        type=_ints,
        default=None,
        metavar="N,N",
        help="the milliseconds a slice takes, step read and sequence read at these chunks",
    )
    parser.add_argument(
        "--chunk", type=int, default=None, help="the sequence read's chunk (default: --prefill's)"
    )
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--tokens", type=_ints, default=DEFAULT_TOKENS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-tail", type=int, default=0, metavar="N")
    parser.add_argument("--graph-tokens", type=int, default=256)
    parser.add_argument("--cpu-blas", default=None, metavar="bundled|openblas|PATH")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from realtime.cpu_blas import install_from

    install_from(args.cpu_blas)  # before MLX loads
    from benchmarks.common import model_path, write_json
    from benchmarks.stats import machine
    from realtime.models import load_model
    from realtime.models.prompt_cache import PrefillRead

    read = PrefillRead("sequence") if args.chunk is None else PrefillRead("sequence", args.chunk)
    path: Path = model_path(args)
    model = load_model(path)
    figures: dict[str, Any] = {
        "size": args.size if args.model is None else str(path),
        "chunk": read.chunk,
        "cpu_blas": args.cpu_blas or "bundled",
        "machine": machine(),
    }
    if not (args.difference or args.speed or args.graph or args.slices):
        args.difference = args.speed = args.graph = True
    if args.slices:
        figures["slices"] = slice_costs(model, args.slices, args.graph_tokens * 2)
    if args.graph:
        figures["graph"] = graph_terms(model, read, args.graph_tokens)
        print(json.dumps(figures["graph"]), file=sys.stderr, flush=True)
    if args.speed:
        figures["speed"] = speed(model, read, args.tokens, args.rounds, args.step_tail)
    if args.difference:
        figures["difference"] = difference(model, read, args.prompts, args.frames)
        print(table(figures["difference"]), flush=True)
    write_json(args.json, figures)
    return 0


def table(result: dict[str, Any]) -> str:
    lines = [
        "| prompt | tokens | text differ (first) | function differ (first) | codes differ (first) |"
    ]
    lines.append("|---|---|---|---|---|")
    for row in result["rows"]:
        cells = []
        for channel in ("text", "function", "audio_codes"):
            held = row[channel]
            first = "-" if held["first"] is None else held["first"]
            cells.append(f"{held['differ']}/{held['n']} ({first})")
        lines.append(f"| {row['prompt']} | {row['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
