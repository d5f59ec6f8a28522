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

from realtime.engine.commands import Close, Flush, Open, Push
from realtime.engine.facade import Engine
from realtime.models import load_model
from realtime.models.base import AudioDelta, Done, ModelEvent
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

    for name in ("__init__", "flush", "cancel"):
        monkeypatch.setattr(VoiceChatStreamingSession, name, recording(name))
    from realtime.models.voicechat import step as voicechat_step

    step_frames = voicechat_step.step_frames

    def stepping(*args: Any) -> Any:
        threads.append(("step_frames", threading.get_ident()))
        return step_frames(*args)

    monkeypatch.setattr(voicechat_step, "step_frames", stepping)

    def loader() -> Any:
        threads.append(("load", threading.get_ident()))
        return load_model(demo_path)

    engine = Engine(loader)
    engine.start()
    try:
        engine.submit(Open("sess_a", None, 0, None)).result(timeout=60)
        events: list[ModelEvent] = []
        for i in range(3):
            step = engine.submit(Push("sess_a", noise(1280, seed=i), 16000)).result(timeout=60)
            assert step is not None
            events += step.events
        events += engine.submit(Flush("sess_a", True)).result(timeout=60)
        engine.submit(Close("sess_a")).result(timeout=60)
        engine.submit(Open("sess_b", None, 1, None)).result(timeout=60)
        engine.submit(Close("sess_b")).result(timeout=60)  # cancels the unflushed session
    finally:
        engine.shutdown()
    assert [e.frame_index for e in events if isinstance(e, AudioDelta)] == [0, 1, 2]
    assert isinstance(events[-1], Done)
    names = [n for n, _ in threads]
    assert names.count("step_frames") == 3 and "cancel" in names
    engine_thread = threads[0][1]  # the thread that loaded the model
    assert {t for _, t in threads} == {engine_thread}
    assert engine_thread != threading.get_ident()


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
