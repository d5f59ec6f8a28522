"""The server on the demo VoiceChat checkpoint: real mlx-vlm model, real engine thread."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from realtime.engine import Engine
from realtime.models import load_model
from realtime.models.base import AudioDelta, Done
from tests.helpers import ServerProcess, append_msg, connect, noise, running_server


def test_serve_without_model_uses_demo(demo_server: ServerProcess) -> None:
    with urllib.request.urlopen(demo_server.http + "/health", timeout=10) as response:
        health = json.loads(response.read())
    assert health["status"] == "ok" and health["engine_alive"] is True
    assert health["model"] == "realtime-demo-voicechat"
    assert "DEMO checkpoint" in demo_server.output()


def test_engine_runs_real_model_on_one_thread(
    demo_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlx_vlm.models.nemotron_voicechat import VoiceChatStreamingSession

    threads: list[tuple[str, int]] = []

    def recording(name: str) -> Any:
        original = getattr(VoiceChatStreamingSession, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            threads.append((name, threading.get_ident()))
            return original(self, *args, **kwargs)

        return wrapper

    for name in ("__init__", "_step_audio_frame", "flush", "cancel"):
        monkeypatch.setattr(VoiceChatStreamingSession, name, recording(name))

    def loader() -> Any:
        threads.append(("load", threading.get_ident()))
        return load_model(demo_path)

    engine = Engine(loader)
    engine.start()
    try:
        engine.call("open", "sess_a", None, 0, None, timeout=60)
        events = []
        for i in range(3):
            events += engine.call("push", "sess_a", noise(1280, seed=i), 16000, timeout=60)
        events += engine.call("flush", "sess_a", True, timeout=60)
        engine.call("close", "sess_a", timeout=60)
        engine.call("open", "sess_b", None, 1, None, timeout=60)
        engine.call("close", "sess_b", timeout=60)  # cancels the unflushed session
    finally:
        engine.shutdown()
    assert [e.frame_index for e in events if isinstance(e, AudioDelta)] == [0, 1, 2]
    assert isinstance(events[-1], Done)
    names = [n for n, _ in threads]
    assert names.count("_step_audio_frame") == 3 and "cancel" in names
    assert {t for _, t in threads} == {engine.thread_ident}
    assert engine.thread_ident != threading.get_ident()


async def test_socket_streams_the_demo_model(demo_path: Path) -> None:
    engine = Engine(lambda: load_model(demo_path))
    engine.start()
    try:
        async with running_server(engine) as server, connect(server.url) as client:
            updated = await client.configure(model="mlx-community/realtime-demo-voicechat", seed=3)
            assert updated["session"]["model"] == "realtime-demo-voicechat"
            for _ in range(4):
                await client.send(append_msg(noise(1280 * 5)))
            await client.send({"type": "input_audio_buffer.commit"})
            events = await client.recv_until("response.done", timeout=120)
    finally:
        engine.shutdown()
    audio = [e for e in events if e["type"] == "response.audio.delta"]
    assert [a["frame_index"] for a in audio] == list(range(20))
    for a in audio:
        pcm = np.frombuffer(base64.b64decode(a["delta"]), dtype="<i2")
        assert pcm.shape == (1764,) and len(a["audio_codes"]) == 31
    assert events[-1]["frame_index"] == 20
