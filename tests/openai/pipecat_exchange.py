"""``python -m tests.openai.pipecat_exchange MODE WS_BASE_URL``: a live Pipecat pipeline.

Run with Pipecat first on ``PYTHONPATH`` (installed without its dependencies, beside a
few small ones it imports: see ``tests/openai/conftest.py``). A pipeline of Pipecat's
``OpenAIRealtimeLLMService`` and a sink holds one exchange with the endpoint:
``vad`` streams speech-like audio and lets the server's VAD take the turn;
``push_to_talk`` (``turn_detection`` off) frames the speech with Pipecat's
user-started/stopped-speaking frames, which make the service commit and ask for the
response; ``cold_vad`` is ``vad`` with ``COLD_LEAD`` seconds of silence streamed first,
as a microphone does while a slow model still opens. Prints one JSON line: the audio
frames, text and errors the pipeline saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np

RATE = 24_000
CHUNK = RATE // 50  # 20 ms
COLD_LEAD = 3.0
"""``cold_vad``: seconds of silence streamed before the speech."""


def _audio(seconds: float, level: float, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(int(seconds * RATE)) * level
    pcm = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    return [pcm[i : i + 2 * CHUNK] for i in range(0, len(pcm), 2 * CHUNK)]


async def exchange(mode: str, url: str) -> dict[str, Any]:
    from pipecat.frames.frames import (  # type: ignore[import-not-found]
        EndFrame,
        ErrorFrame,
        InputAudioRawFrame,
        LLMFullResponseEndFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline  # type: ignore[import-not-found]
    from pipecat.pipeline.runner import PipelineRunner  # type: ignore[import-not-found]
    from pipecat.pipeline.task import PipelineParams, PipelineTask  # type: ignore[import-not-found]
    from pipecat.processors.frame_processor import (  # type: ignore[import-not-found]
        FrameDirection,
        FrameProcessor,
    )
    from pipecat.services.openai.realtime import events  # type: ignore[import-not-found]
    from pipecat.services.openai.realtime.llm import (  # type: ignore[import-not-found]
        OpenAIRealtimeLLMService,
    )

    seen: dict[str, Any] = {"audio_frames": 0, "text": "", "errors": [], "responses": 0}
    done = asyncio.Event()

    class Sink(FrameProcessor):  # type: ignore[misc]
        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                seen["audio_frames"] += 1
            elif isinstance(frame, LLMTextFrame):
                seen["text"] += frame.text
            elif isinstance(frame, ErrorFrame):
                seen["errors"].append(str(frame.error))
            elif isinstance(frame, LLMFullResponseEndFrame) and seen["audio_frames"]:
                seen["responses"] += 1
                done.set()
            await self.push_frame(frame, direction)

    detection: Any = False if mode == "push_to_talk" else events.TurnDetection()
    properties = events.SessionProperties(
        audio=events.AudioConfiguration(input=events.AudioInput(turn_detection=detection))
    )
    llm = OpenAIRealtimeLLMService(
        api_key="sk-local-test", base_url=url, session_properties=properties
    )
    task = PipelineTask(
        Pipeline([llm, Sink()]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )

    async def speak() -> None:
        await asyncio.sleep(1.0)  # the session is set up
        for chunk in _audio(COLD_LEAD if mode == "cold_vad" else 0.0, 0.0):
            await task.queue_frame(
                InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
            )
            await asyncio.sleep(0.02)
        if mode == "push_to_talk":
            await task.queue_frame(UserStartedSpeakingFrame())
        for chunk in _audio(1.0, 0.2):
            await task.queue_frame(
                InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
            )
            await asyncio.sleep(0.02)
        if mode == "push_to_talk":
            await task.queue_frame(UserStoppedSpeakingFrame())
        for chunk in _audio(6.0, 0.0):
            if done.is_set():
                break
            await task.queue_frame(
                InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
            )
            await asyncio.sleep(0.02)
        await asyncio.wait_for(done.wait(), 20)
        await task.queue_frame(EndFrame())

    runner = PipelineRunner(handle_sigint=False)
    await asyncio.wait_for(asyncio.gather(runner.run(task), speak()), 60)
    del FrameDirection
    return seen


def main(argv: list[str]) -> None:
    mode, ws_base = argv  # .../openai/v1: Pipecat takes the endpoint's whole address
    print(json.dumps(asyncio.run(exchange(mode, ws_base + "/realtime"))))


if __name__ == "__main__":
    main(sys.argv[1:])
