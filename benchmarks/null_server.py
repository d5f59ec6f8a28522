"""``python -m benchmarks.null_server``: the real server on :class:`NullModel`.

A separate process, so the benchmark client never shares a GIL with the
server it measures. Prints the same ``realtime: serving`` line as ``realtime serve``.
"""

from __future__ import annotations

import argparse
import logging

from realtime.engine.facade import Engine
from realtime.observe import Observer
from realtime.telemetry.metrics import PrometheusObserver
from realtime.testing.fake import NullModel
from realtime.testing.servers import serve_engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.null_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="no-op observer instead of the Prometheus metrics and session log "
        "(to measure what updating them costs)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    engine = Engine(NullModel)
    engine.start()
    if args.no_metrics:
        serve_engine(
            engine, args.host, args.port, metrics=PrometheusObserver(), observer=Observer()
        )
    else:
        serve_engine(engine, args.host, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
