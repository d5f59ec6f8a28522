"""What a newcomer meets first: --version, serve --help, plain HTTP at the WebSocket
path, the chat routes, and a bad REALTIME_MODEL under the Hypercorn CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from realtime import __version__
from realtime.engine.facade import Engine
from realtime.launch.cli import main
from tests.helpers import REPO, ahttp, running_server

EVERY_METHOD = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"realtime {__version__}"


def test_serve_help_shows_default_host_and_port(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--host HOST address to listen on (default 127.0.0.1)" in text
    assert "--port PORT port to listen on (default 8080)" in text
    assert "Hugging Face repo id" in text


async def test_plain_http_at_the_websocket_path_is_426(engine: Engine) -> None:
    async with running_server(engine) as server:
        for method in ("GET", "POST"):
            status, body = await ahttp(method, server.http + "/v1/realtime")
            assert status == 426, body
            assert body["error"]["code"] == "upgrade_required"
            assert "WebSocket" in body["error"]["message"]
            assert "ws://" in body["error"]["message"]


async def test_chat_routes_answer_501_json_for_every_method(engine: Engine) -> None:
    async with running_server(engine) as server:
        for route in ("/v1/chat/completions", "/v1/completions"):
            for method in EVERY_METHOD:
                status, body = await ahttp(method, server.http + route)
                assert status == 501, (route, method, body)
                assert body["error"]["code"] == "not_implemented", (route, method)
                assert "/v1/realtime" in body["error"]["message"]


@pytest.mark.slow
def test_hypercorn_cli_exits_non_zero_on_a_bad_model(tmp_path: object) -> None:
    """Hypercorn loses its workers' exit status (pgjones/hypercorn#269); the app makes
    the whole command fail anyway, with its one line."""
    hypercorn = os.path.join(os.path.dirname(sys.executable), "hypercorn")
    env = {**os.environ, "REALTIME_MODEL": "/nonexistent/voicechat"}
    run = subprocess.run(
        [hypercorn, "-k", "trio", "-b", "127.0.0.1:0", "realtime.launch.asgi:app"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode != 0, run.stderr
    assert "realtime: error: model path /nonexistent/voicechat does not exist" in run.stderr
    assert "Traceback" not in run.stderr
