"""``python -m benchmarks.null_server``: the real server on :class:`NullModel`.

A separate process, so the benchmark client never shares a GIL with the
server it measures. Prints the same ``realtime: serving`` line as ``realtime serve``.
"""

from __future__ import annotations

import argparse
import logging
import sys

import trio

from realtime.app import ServerState
from realtime.engine import Engine
from realtime.limits import Limits
from realtime.models.fake import NullModel
from realtime.server import hypercorn_config, run_server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.null_server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    engine = Engine(NullModel)
    engine.start()
    limits = Limits()
    state = ServerState(engine=engine, limits=limits)
    config = hypercorn_config(args.host, args.port, limits)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(run_server, state, config)
            for bind in binds:
                url = bind.replace("http://", "ws://") + "/v1/realtime"
                print(f"realtime: serving {url}", file=sys.stderr, flush=True)

    try:
        trio.run(serve)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
