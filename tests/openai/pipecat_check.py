"""``python -m tests.openai.pipecat_check EVENTS.jsonl``: Pipecat parses every event.

Run with Pipecat first on ``PYTHONPATH``; exits non-zero naming the first event
its ``parse_server_event`` refuses.
"""

from __future__ import annotations

import sys


def main(path: str) -> None:
    from pipecat.services.openai.realtime.events import (  # type: ignore[import-not-found]
        parse_server_event,
    )

    with open(path, encoding="utf-8") as lines:
        for n, line in enumerate(lines):
            try:
                parse_server_event(line)
            except Exception as exc:
                raise SystemExit(f"event {n} refused by Pipecat: {exc}\n{line[:400]}") from exc


if __name__ == "__main__":
    main(sys.argv[1])
