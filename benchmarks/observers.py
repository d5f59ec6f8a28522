"""``python -m benchmarks.observers``: what updating the metrics costs per frame.

Row 2's zero-cost server, run in alternating rounds with the Prometheus metrics and
the session log attached (as ``realtime serve`` runs) and with a no-op observer;
server CPU per frame and unpaced frames per second, medians of the rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import trio

from benchmarks import servers, streams
from benchmarks.wire import figures_for, frame_messages, test_pcm


def _one(metrics: bool, messages: list[str]) -> dict[str, Any]:
    with servers.null_server(metrics=metrics) as server:

        async def run() -> dict[str, Any]:
            await streams.warm_up(server.url, None, messages[:50])
            return await streams.unpaced(server.url, None, messages, server.cpu_seconds)

        return trio.run(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.observers", description=__doc__)
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    figures = figures_for(None)  # the zero-cost model's
    messages = frame_messages(test_pcm(args.frames * figures.frame_samples, seed=2), figures)
    results: dict[str, list[dict[str, Any]]] = {"metrics": [], "none": []}
    for i in range(args.rounds):
        # ABBA: neither variant always runs first (the first server of a round
        # starts on a colder machine).
        for name in ("metrics", "none") if i % 2 == 0 else ("none", "metrics"):
            results[name].append(_one(name == "metrics", messages))
    summary = {
        name: {
            "server_cpu_us_per_frame": statistics.median(
                r["server_cpu_ms_per_frame"] * 1000 for r in rounds
            ),
            "fps": statistics.median(r["fps"] for r in rounds),
        }
        for name, rounds in results.items()
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
