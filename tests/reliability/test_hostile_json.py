"""The native endpoint refuses a message by its structure before
building it, as the OpenAI endpoint does (:mod:`realtime.jsonbounds`, one bound for
both). Before, ``{"type":"x","a":[{},{},...]}`` with 1.3 million objects, legal under
the 4 MiB message bound, was parsed whole on the event loop (0.3-0.65 s and ~100 MB
each) and only then refused as an unknown type.

Judged by counts (how many times a message was built), not by time: the loop time
it saves is measured by ``benchmarks/hostile_json.py`` (docs/reliability.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from realtime import jsonbounds
from realtime.engine.facade import Engine
from realtime.native.wire import ProtocolError, parse_client_message
from tests.helpers import connect, running_server

OBJECTS = 1_300_000
FLOOD = '{"type":"x","a":[' + ",".join(["{}"] * OBJECTS) + "]}"
"""The red team's message: 3.9 MB, 1.3 million values."""
DEEP = "[" * 100_000 + "]" * 100_000
TOO_DEEP = '{"type":"session.ping","x":' + "[" * 65 + "]" * 65 + "}"


class CountingLoads:
    """``json.loads`` (the function both endpoints parse with), counting the texts of
    more than a megabyte it was given."""

    def __init__(self) -> None:
        self.big = 0
        self._loads = json.loads

    def __call__(self, text: str | bytes, **kwargs: Any) -> Any:
        if len(text) > 1 << 20:
            self.big += 1
        return self._loads(text, **kwargs)


def test_the_native_parser_refuses_by_structure_before_building() -> None:
    for frame, why in (
        (FLOOD, f"holds more than {jsonbounds.MAX_JSON_VALUES} JSON values"),
        (DEEP, f"holds more than {jsonbounds.MAX_JSON_VALUES} JSON values"),
        (TOO_DEEP, f"nests deeper than {jsonbounds.MAX_JSON_DEPTH} levels"),
        ("[" * 3000 + "]" * 3000, "nests deeper than"),  # within the count, past the parser
    ):
        with pytest.raises(ProtocolError, match=why):
            parse_client_message(frame)
    # At the bound a message is served (a ping with 64 levels and 4,096 values).
    nested = "[" * 63 + "]" * 63
    assert jsonbounds.shape(json.loads(nested)).depth == 63
    parse_client_message('{"type":"session.ping","x":' + nested + "}")
    room = jsonbounds.MAX_JSON_VALUES - 3
    parse_client_message('{"type":"session.ping","x":[' + ",".join(["0"] * room) + "]}")
    with pytest.raises(ProtocolError, match="JSON values"):
        parse_client_message('{"type":"session.ping","x":[' + ",".join(["0"] * (room + 1)) + "]}")


async def test_a_json_flood_on_the_native_endpoint_is_never_built(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real server: 20 of the red team's messages and 5 100,000-deep ones, each
    refused with one error and never parsed; the connection goes on (a ping answered)."""
    loads = CountingLoads()
    monkeypatch.setattr(json, "loads", loads)
    async with running_server(engine) as server, connect(server.url) as client:
        assert (await client.recv())["type"] == "session.created"
        for frame in [FLOOD] * 20 + [DEEP] * 5:
            await client.send(frame)
            error = await client.recv(timeout=30)
            assert error["type"] == "error", error
            assert error["error"]["code"] == "invalid_request"
            assert "more than 4096 JSON values" in error["error"]["message"]
        await client.send({"type": "session.ping"})
        assert (await client.recv())["type"] == "session.pong"
    # Before: 25 (each parsed whole, then refused as an unknown type or for its depth).
    assert loads.big == 0
