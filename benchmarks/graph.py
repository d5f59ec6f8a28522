"""``python -m benchmarks.graph``: a frame step's host work in exact counts.

On an accelerator a frame step is bound by host work (Python building the graph,
kernel launches, waits on the device), not by arithmetic, and that work can be counted
exactly on any machine. Per step (one frame of every row), for mlx-vlm's streaming
session at B=1 and this project's batched step at B = 1, 8, 32 (equal ages), 8 rows
of staggered ages (all younger than the conformer's 70-frame attention context), 8 rows
one of which opens every step, and 8 rows one of which is past its TTS window (cut to
:data:`WINDOW` frames), on the tiny, medium and deep demo checkpoints:

- **waits**: synchronous evaluations that still had work to run (a graph with at least
  one primitive, or arrays an earlier ``mx.async_eval`` submitted and nothing has read);
- **compute** and **view** nodes: the primitives of every evaluated graph (views:
  reshapes, slices, broadcasts and the like, which launch no kernel on a GPU);
- **AsType** nodes (dtype casts, a compute node each);
- **host ms**: the step's wall time minus the time spent inside MLX's evaluation entry
  points, from runs that do not read the graphs (the only figure that is a timing; with
  ``--rounds N`` the shapes alternate N times and the median is shown with its spread);
- **weight bytes**: computed from the graphs: every edge from a model parameter into a
  primitive reads that parameter once, and a cast of a parameter writes and reads its
  float32 copy once more.

Counted by wrapping MLX's evaluation entry points (``mx.eval``, ``mx.async_eval``,
``array.item/tolist/__array__/__int__/__float__/__bool__/__index__``, and numpy's
``array``/``asarray`` given an MLX array, which read it through the buffer protocol) and
reading each evaluated graph with ``mx.export_to_dot`` before it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np

VIEW_OPS: Final = frozenset(
    {
        "AsStrided",
        "Broadcast",
        "BroadcastAxes",
        "Depends",
        "ExpandDims",
        "Flatten",
        "Reshape",
        "Slice",
        "Split",
        "Squeeze",
        "StopGradient",
        "Transpose",
        "Unflatten",
    }
)
"""Primitives that make a view of their input on a GPU (no kernel launched)."""

SHAPES: Final = (
    "mlx-vlm B=1",
    "B=1",
    "B=8",
    "B=32",
    "B=8 staggered",
    "B=8 opening",
    "B=8 past window",
)
"""The step shapes measured, as the table names them ("opening": 7 rows of equal age
and, every step, a conversation's first frame; "past window": 8 rows of equal age but
one whose TTS window has wrapped)."""
WINDOW: Final = 8
"""The TTS window of the "past window" shape's rows (the checkpoint's is 7,500 frames,
ten minutes; here one row is past it after a few frames)."""
STAGGER: Final = 3
"""Frames between the ages of the staggered rows (8 rows: 0 to 21 frames older than the
youngest, so all stay under the conformer's 70 frames)."""
SIZES: Final = ("tiny", "medium", "deep")

_NAMES: Final = 1000
"""Parameters named per ``mx.export_to_dot`` call (nanobind takes at most 1,024)."""
_NODE = re.compile(r'^\{ (\d+) \[label ="([^"]+)", shape=rectangle\]; \}$')
_EDGE = re.compile(r'^"?([^"\s]+)"? -> "?([^"\s]+)"?$')


@attrs.frozen(slots=True)
class GraphCounts:
    """What one evaluated graph holds (or the sum of several)."""

    compute: int = 0
    views: int = 0
    astype: int = 0
    weight_bytes: int = 0

    def __add__(self, other: GraphCounts) -> GraphCounts:
        return GraphCounts(
            self.compute + other.compute,
            self.views + other.views,
            self.astype + other.astype,
            self.weight_bytes + other.weight_bytes,
        )


@attrs.frozen(slots=True)
class Weight:
    """A model parameter's size, as the weight-bytes figure needs it."""

    nbytes: int
    itemsize: int


def count_dot(text: str, weights: Mapping[str, Weight]) -> GraphCounts:
    """The counts of one graph as ``mx.export_to_dot`` writes it, with the model's
    parameters named as in ``weights``."""
    ops: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    for line in text.splitlines():
        node = _NODE.match(line)
        if node:
            ops[node.group(1)] = node.group(2)
            continue
        edge = _EDGE.match(line)
        if edge:
            edges.append((edge.group(1), edge.group(2)))
    producer = {target: source for source, target in edges if source in ops}
    inputs: dict[str, list[str]] = {}
    for source, target in edges:
        if target in ops:
            inputs.setdefault(target, []).append(source)

    def origin(array: str) -> str:
        """The array a view chain starts from (a weight, seen through a transpose)."""
        while array in producer and ops[producer[array]] in VIEW_OPS:
            array = inputs[producer[array]][0]
        return array

    names = Counter(ops.values())
    views = sum(n for op, n in names.items() if op in VIEW_OPS)
    read = 0
    for source, target in edges:
        weight = weights.get(source)
        if weight is not None and target in ops:
            read += weight.nbytes
    for op, kind in ops.items():
        weight = weights.get(origin(inputs[op][0])) if kind == "AsType" else None
        if weight is not None:  # its float32 copy, written and read again
            read += 2 * weight.nbytes * 4 // weight.itemsize
    return GraphCounts(len(ops) - views, views, names["AsType"], read)


@attrs.define
class Probe:
    """MLX's evaluation entry points, wrapped: each evaluation's graph counted (with
    ``graphs``) and the time spent inside them summed."""

    weights: dict[str, Any]
    """Dot name -> parameter array (named so their edges can be found)."""
    graphs: bool
    sizes: dict[str, Weight] = attrs.field(init=False)
    chunks: list[dict[str, Any]] = attrs.field(init=False)
    """The names in pieces: one call takes at most 1,024 keyword arguments."""
    waits: int = 0
    counts: GraphCounts = GraphCounts()
    inside: float = 0.0
    _submitted: list[Any] = attrs.field(factory=list)
    _depth: int = 0

    def __attrs_post_init__(self) -> None:
        self.sizes = {
            name: Weight(int(value.nbytes), int(value.itemsize))
            for name, value in self.weights.items()
        }
        items = list(self.weights.items())
        self.chunks = [dict(items[k : k + _NAMES]) for k in range(0, len(items), _NAMES)] or [{}]

    def _count(self, arrays: Sequence[Any], synchronous: bool) -> None:
        import mlx.core as mx

        live = [a for a in arrays if isinstance(a, mx.array)]
        pending = any(a is p for a in live for p in self._submitted)
        if pending:
            self._submitted = [p for p in self._submitted if not any(p is a for a in live)]
        graph = GraphCounts()
        for k, names in enumerate(self.chunks):
            buffer = io.StringIO()
            mx.export_to_dot(buffer, *live, **names)
            part = count_dot(buffer.getvalue(), self.sizes)
            graph += part if k == 0 else GraphCounts(weight_bytes=part.weight_bytes)
        self.counts += graph
        if synchronous and (graph.compute + graph.views > 0 or pending):
            self.waits += 1
        if not synchronous:
            self._submitted += live

    def wrap(self, call: Callable[..., Any], synchronous: bool = True) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return call(*args, **kwargs)
            self._depth += 1
            try:
                if self.graphs:
                    self._count(_arrays(args), synchronous)
                started = time.perf_counter()
                try:
                    return call(*args, **kwargs)
                finally:
                    self.inside += time.perf_counter() - started
            finally:
                self._depth -= 1

        return wrapped

    def wrap_numpy(self, call: Callable[..., Any]) -> Callable[..., Any]:
        import mlx.core as mx

        inner = self.wrap(call)

        def wrapped(value: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(value, mx.array):
                return inner(value, *args, **kwargs)
            return call(value, *args, **kwargs)

        return wrapped


def _arrays(args: Sequence[Any]) -> list[Any]:
    """The arrays among ``args`` and in the lists, tuples and dicts they hold."""
    found: list[Any] = []
    stack = list(args)
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        else:
            found.append(item)
    return found


_ARRAY_METHODS: Final = (
    "item",
    "tolist",
    "__array__",
    "__int__",
    "__float__",
    "__bool__",
    "__index__",
)


@contextlib.contextmanager
def probing(probe: Probe) -> Iterator[Probe]:
    """``probe`` wrapped around MLX's evaluation entry points while the block runs."""
    import mlx.core as mx

    saved: list[tuple[Any, str, Any]] = [
        (mx, "eval", mx.eval),
        (mx, "async_eval", mx.async_eval),
        (np, "array", np.array),
        (np, "asarray", np.asarray),
        *((mx.array, name, getattr(mx.array, name)) for name in _ARRAY_METHODS),
    ]
    try:
        mx.eval = probe.wrap(mx.eval)
        mx.async_eval = probe.wrap(mx.async_eval, synchronous=False)
        np.array = probe.wrap_numpy(np.array)
        np.asarray = probe.wrap_numpy(np.asarray)
        for name in _ARRAY_METHODS:
            setattr(mx.array, name, probe.wrap(getattr(mx.array, name)))
        yield probe
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def named_weights(model: Any) -> dict[str, Any]:
    """The model's parameters under dot-safe names."""
    from mlx.utils import tree_flatten

    flat = tree_flatten(model.runtime.model.parameters())
    return {f"w{k}": value for k, (_, value) in enumerate(flat)}


@attrs.frozen(slots=True)
class ShapeFigures:
    """One shape's figures per step (means over the measured steps)."""

    shape: str
    rows: int
    waits: float
    compute: float
    views: float
    astype: float
    weight_mb: float
    host_ms: float
    """The median over the timing rounds (``host_rounds``: each round's)."""
    step_ms: float
    host_rounds: tuple[float, ...] = ()
    step_rounds: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


Stepper = Callable[[int], None]
"""Runs step ``t`` of a scenario (every row that has a frame at ``t``)."""


def noise_audio(seed: int, frames: int) -> Any:
    """``frames`` frames of conversation ``seed``'s input: noise, which the random
    weights answer with text."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.standard_normal(frames * 1280) * 0.1, -1.0, 0.999).astype(np.float32)


def _ours(model: Any, starts: Sequence[int], frames: int, seeds: int = 0) -> Stepper:
    """This project's step over rows opened at ``starts`` (frame indices), row ``k``
    with seed ``seeds + k``."""
    from realtime.models.base import open_session

    sessions: list[Any] = [None] * len(starts)
    audio = [noise_audio(k, frames) for k in range(len(starts))]

    def step(t: int) -> None:
        batch = []
        for k, start in enumerate(starts):
            if t == start:
                sessions[k] = open_session(
                    model, system_prompt=None, seed=seeds + k, max_streaming_seconds=None
                )
            if t >= start:
                f = t - start
                batch.append((sessions[k], audio[k][f * 1280 : (f + 1) * 1280], 16000))
        for result in model.step(batch):
            if isinstance(result, Exception):
                raise result

    return step


def _opening(model: Any, rows: int, frames: int) -> Stepper:
    """``rows - 1`` rows opened together and, at each step, one more conversation's
    first frame (each opened before the steps run, so no opening is counted)."""
    from realtime.models.base import open_session

    def opened(seed: int) -> Any:
        return open_session(model, system_prompt=None, seed=seed, max_streaming_seconds=None)

    steady = [opened(k) for k in range(rows - 1)]
    fresh = [opened(rows + t) for t in range(frames)]
    audio = [noise_audio(k, frames) for k in range(rows)]

    def step(t: int) -> None:
        piece = slice(t * 1280, (t + 1) * 1280)
        batch = [(s, audio[k][piece], 16000) for k, s in enumerate(steady)]
        batch.append((fresh[t], audio[-1][:1280], 16000))
        for result in model.step(batch):
            if isinstance(result, Exception):
                raise result

    return step


def _windowed(model: Any, starts: Sequence[int], frames: int) -> Stepper:
    """:func:`_ours` with every row's TTS window cut to :data:`WINDOW` frames (the
    rows must share one window to share a batch; seeds no other shape uses, so no
    prompt state stored with the checkpoint's window is reused)."""
    config = model.runtime.model.tts_model.tts_model.config
    kept = config.sliding_window
    config.sliding_window = WINDOW
    try:
        step = _ours(model, starts, frames, seeds=1000)
        for t in range(max(starts) + 1):  # every row opened under the cut window
            step(t)
    finally:
        config.sliding_window = kept
    return lambda t: None if t <= max(starts) else step(t)


def _mlx_vlm(model: Any, frames: int) -> Stepper:
    """mlx-vlm's own streaming session, one row (this project's fused modules bypassed,
    so that it is mlx-vlm's graph that is counted)."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    from realtime.models.voicechat.fused import unfused
    from realtime.models.voicechat.keys import SessionKey, drawing_from, install_voicechat

    install_voicechat()
    key = SessionKey(0)
    with drawing_from(key):
        session = VoiceChatStreamingSession(model.runtime, system_prompt=None, seed=0)
    audio = noise_audio(0, frames)

    def step(t: int) -> None:
        with drawing_from(key), unfused():
            session.push_audio(audio[t * 1280 : (t + 1) * 1280], sample_rate=16000)

    return step


def _scenario(model: Any, shape: str, warm: int, frames: int) -> tuple[Stepper, int, int]:
    """The stepper of ``shape``, its rows and the step measuring starts at."""
    if shape == "mlx-vlm B=1":
        return _mlx_vlm(model, warm + frames), 1, warm
    if shape == "B=8 opening":
        return _opening(model, 8, warm + frames), 8, warm
    if shape == "B=8 past window":
        past = WINDOW + 2  # the old row's age when the others open
        starts = [0] + [past] * 7
        return _windowed(model, starts, past + warm + frames), 8, past + warm
    if shape.endswith("staggered"):
        rows = int(shape.split()[0].removeprefix("B="))
        oldest = STAGGER * (rows - 1)
        starts = [oldest - STAGGER * k for k in range(rows)]
        return _ours(model, starts, oldest + warm + frames), rows, oldest + warm
    rows = int(shape.removeprefix("B="))
    return _ours(model, [0] * rows, warm + frames), rows, warm


def _run(
    model: Any, shape: str, weights: dict[str, Any], graphs: bool, warm: int, frames: int
) -> tuple[Probe, float]:
    """One run of ``shape`` on fresh sessions (the same input, so the same path): its
    probe (counting graphs or not) and the wall seconds of the measured steps."""
    import mlx.core as mx

    step, _, first = _scenario(model, shape, warm, frames)
    for t in range(first):
        step(t)
    mx.clear_cache()
    probe = Probe(weights, graphs=graphs)
    started = time.perf_counter()
    with probing(probe):
        for t in range(first, first + frames):
            step(t)
    return probe, time.perf_counter() - started


def _counted(
    model: Any, shape: str, weights: dict[str, Any], warm: int, frames: int
) -> dict[str, float]:
    probe, _ = _run(model, shape, weights, True, warm, frames)
    return {
        "waits": probe.waits / frames,
        "compute": probe.counts.compute / frames,
        "views": probe.counts.views / frames,
        "astype": probe.counts.astype / frames,
        "weight_mb": probe.counts.weight_bytes / frames / 1e6,
    }


def _timed(
    model: Any, shape: str, weights: dict[str, Any], warm: int, frames: int
) -> tuple[float, float]:
    """Host and step milliseconds a step, from an uninstrumented-graph run."""
    probe, wall = _run(model, shape, weights, False, warm, frames)
    return (wall - probe.inside) / frames * 1e3, wall / frames * 1e3


def _rows(shape: str) -> int:
    return 1 if shape == "mlx-vlm B=1" else int(shape.split()[0].removeprefix("B="))


def measure_shape(model: Any, shape: str, warm: int = 2, frames: int = 3) -> ShapeFigures:
    """``shape``'s figures: a counting run, then one timing run."""
    return measure(model, [shape], warm, frames, rounds=1, primed=True)[0]


def prime(model: Any, frames: int = 4) -> None:
    """A few frames of both steps, uncounted: what a model builds once (the codec's
    search tables, MLX's kernels and buffers) is not any shape's cost."""
    for shape in ("mlx-vlm B=1", "B=1"):
        step, _, _ = _scenario(model, shape, 0, frames)
        for t in range(frames):
            step(t)


def measure(
    model: Any,
    shapes: Sequence[str] = SHAPES,
    warm: int = 2,
    frames: int = 3,
    rounds: int = 1,
    primed: bool = False,
) -> list[ShapeFigures]:
    """Every shape's figures on one loaded model: the counts once (they are exact),
    the timings in ``rounds`` rounds that alternate the shapes (so a slow minute of a
    shared machine falls on all of them), medians."""
    if not primed:
        prime(model, warm + frames)
    weights = named_weights(model)
    counts = {shape: _counted(model, shape, weights, warm, frames) for shape in shapes}
    timings: dict[str, list[tuple[float, float]]] = {shape: [] for shape in shapes}
    for _ in range(rounds):
        for shape in shapes:
            timings[shape].append(_timed(model, shape, weights, warm, frames))
    out = []
    for shape in shapes:
        host = tuple(h for h, _ in timings[shape])
        step = tuple(w for _, w in timings[shape])
        out.append(
            ShapeFigures(
                shape=shape,
                rows=_rows(shape),
                **counts[shape],
                host_ms=statistics.median(host),
                step_ms=statistics.median(step),
                host_rounds=host,
                step_rounds=step,
            )
        )
    return out


def counts_of(path: Path, warm: int = 2, frames: int = 3) -> dict[str, Any]:
    """Every shape's figures on the checkpoint at ``path`` (loaded here, on this
    thread), as JSON values: ``python -m benchmarks``' row 9."""
    from realtime.models import load_model

    model = load_model(path)
    shapes = measure(model, SHAPES, warm, frames)
    return {"warm": warm, "frames": frames, "shapes": [s.to_dict() for s in shapes]}


def checkpoint(size: str) -> Path:
    """The cached demo checkpoint of ``size`` (built once), at its preset's bits."""
    from realtime.demo.checkpoint import SIZES as PRESETS
    from realtime.demo.checkpoint import ensure_demo_checkpoint

    preset = PRESETS[size]
    return ensure_demo_checkpoint(preset.quantize, preset)


def table(results: Mapping[str, Sequence[ShapeFigures]]) -> str:
    """The figures as one text table, a line per checkpoint and shape."""
    headers = ("model", "shape", "waits", "compute", "views", "AsType", "weight MB", "host ms")
    lines = [headers]
    for size, rows in results.items():
        for r in rows:
            lines.append(
                (
                    size,
                    r.shape,
                    f"{r.waits:.1f}",
                    f"{r.compute:,.0f}",
                    f"{r.views:,.0f}",
                    f"{r.astype:,.0f}",
                    f"{r.weight_mb:.2f}",
                    f"{r.host_ms:.1f}"
                    + (
                        f" [{min(r.host_rounds):.1f}-{max(r.host_rounds):.1f}]"
                        if len(r.host_rounds) > 1
                        else ""
                    ),
                )
            )
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def _csv(choices: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        bad = [item for item in items if item not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"choose from {', '.join(choices)}; got {text!r}")
        return items

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.graph",
        description="a frame step's waits, graph nodes, casts, weight bytes and host "
        "time, per step, exact (counts) on any machine",
    )
    parser.add_argument("--size", type=_csv(SIZES), default=SIZES, help="checkpoints")
    parser.add_argument(
        "--shapes", type=_csv(SHAPES), default=SHAPES, help="step shapes (comma-separated)"
    )
    parser.add_argument("--warm", type=int, default=2, help="steps before measuring")
    parser.add_argument("--frames", type=int, default=3, help="steps measured")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="timing rounds, alternating the shapes; host ms is their median [min-max] "
        "(the counts are exact, measured once)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--no-cast",
        action="store_true",
        help="load the weights as stored (no cast once at load), to compare",
    )
    parser.add_argument(
        "--no-compile",
        action="store_true",
        help="run the step's compiled pieces op by op (mx.disable_compile), to compare",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.warm < 1 or args.frames < 1 or args.rounds < 1:
        print("--warm, --frames and --rounds must be at least 1", file=sys.stderr)
        return 2
    from realtime.models.voicechat.load import load_voicechat

    if args.no_compile:
        import mlx.core as mx

        mx.disable_compile()
    results: dict[str, list[ShapeFigures]] = {}
    for size in args.size:
        model = load_voicechat(checkpoint(size), cast_weights=not args.no_cast)
        results[size] = measure(model, args.shapes, args.warm, args.frames, args.rounds)
        print(f"{size}: measured", file=sys.stderr, flush=True)
    print(table(results))
    if args.json is not None:
        data = {size: [r.to_dict() for r in rows] for size, rows in results.items()}
        args.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
