"""The real ``openai`` SDK holds whole exchanges with ``/openai/v1/realtime``."""

from __future__ import annotations

from functools import partial

import trio

from realtime.engine import Engine
from tests.helpers import running_server
from tests.openai import sdk_exchange


def ws_base(http: str) -> str:
    return http.replace("http://", "ws://") + "/openai/v1"


async def test_push_to_talk_latest_sdk(scripted_engine: Engine) -> None:
    async with running_server(scripted_engine) as server:
        events = await trio.to_thread.run_sync(
            partial(sdk_exchange.push_to_talk, ws_base(server.http))
        )
    types = [e["type"] for e in events]
    print(types)
    assert types[0] == "session.created"


async def test_server_vad_latest_sdk(scripted_engine: Engine) -> None:
    async with running_server(scripted_engine) as server:
        events = await trio.to_thread.run_sync(
            partial(sdk_exchange.server_vad, ws_base(server.http))
        )
    types = [e["type"] for e in events]
    print(types)
    assert types[0] == "session.created"
