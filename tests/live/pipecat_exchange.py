"""``python -m tests.live.pipecat_exchange WS_URL``: a Live conversation held by a Pipecat
pipeline of ``OpenAILiveLLMService`` with client delegation.

Run with Pipecat first on ``PYTHONPATH`` (``tests/environments/pipecat.txt``, installed
without its dependencies; the suite's environment has the rest). The service's
``ClientDelegation`` backend is a ``BackendLLMWorker`` around a scripted LLM service
that answers every request with a spoken result (``>> sunny in Paris``): the service
hands each delegation to it and appends its output as ``session.commentary.append``
with the delegation's id, as it would a real LLM's. The pipeline starts the session with
an ``LLMContextFrame`` (its system message becomes the instructions), streams a
microphone's frames and ends with an ``EndFrame`` (``session.close``, then
``session.closed`` awaited).

Prints one JSON line: :meth:`tests.live.conversation.Heard.record` (every raw server
event, validated by the test, and the commentary the service sent) and ``requests``,
what the backend was asked (the service renders the transcript since the previous
delegation: the user's words reach the backend only through the server's input
transcripts).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from tests.live.conversation import (
    API_KEY,
    COMMENTARY,
    INSTRUCTIONS,
    MODEL,
    RATE,
    STEP,
    Heard,
    stream,
)


async def _conversation(url: str) -> dict[str, Any]:
    from pipecat.frames.frames import (  # type: ignore[import-not-found]
        EndFrame,
        ErrorFrame,
        InputAudioRawFrame,
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline  # type: ignore[import-not-found]
    from pipecat.pipeline.worker import (  # type: ignore[import-not-found]
        PipelineParams,
        PipelineWorker,
    )
    from pipecat.processors.aggregators.llm_context import (  # type: ignore[import-not-found]
        LLMContext,
    )
    from pipecat.processors.frame_processor import (  # type: ignore[import-not-found]
        FrameProcessor,
    )
    from pipecat.services.llm_service import LLMService  # type: ignore[import-not-found]
    from pipecat.services.openai.live import events  # type: ignore[import-not-found]
    from pipecat.services.openai.live.llm import (  # type: ignore[import-not-found]
        OpenAILiveLLMService,
    )
    from pipecat.services.settings import LLMSettings  # type: ignore[import-not-found]
    from pipecat.workers.llm.backend_llm_worker import (  # type: ignore[import-not-found]
        SPOKEN_MARK,
        BackendLLMWorker,
    )
    from pipecat.workers.runner import WorkerRunner  # type: ignore[import-not-found]

    heard = Heard()
    errors: list[str] = []
    requests: list[str] = []
    """What the backend was asked: the service's rendering of the transcript."""

    parse = events.parse_server_event

    def parse_and_keep(message: str | bytes) -> Any:
        """Pipecat's parser (which the service calls through its module), recording
        the raw event first; an event Pipecat refuses (it would only log and drop it)
        fails the exchange."""
        try:
            heard.add(json.loads(message))
            return parse(message)
        except Exception as exc:
            heard.fail(exc)
            raise

    events.parse_server_event = parse_and_keep

    class Scripted(LLMService):  # type: ignore[misc]
        """The backend's model: every request gets the one spoken result."""

        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, LLMContextFrame):
                requests.append(str(frame.context.messages[-1].get("content", "")))
                await self.push_frame(LLMFullResponseStartFrame())
                await self.push_frame(LLMTextFrame(f"{SPOKEN_MARK} {COMMENTARY}"))
                await self.push_frame(LLMFullResponseEndFrame())
            else:
                await self.push_frame(frame, direction)

    class Live(OpenAILiveLLMService):  # type: ignore[misc]
        async def send_client_event(self, event: Any) -> None:
            payload = event.to_payload()
            if payload["type"] == "session.commentary.append":
                heard.sent.append(payload)
            await super().send_client_event(event)

    class Sink(FrameProcessor):  # type: ignore[misc]
        async def process_frame(self, frame: Any, direction: Any) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, ErrorFrame):
                errors.append(str(frame.error))
            await self.push_frame(frame, direction)

    unused = [
        *("temperature", "max_tokens", "top_p", "top_k", "frequency_penalty"),
        *("presence_penalty", "seed", "filter_incomplete_user_turns"),
        "user_turn_completion_config",
    ]
    scripted = Scripted(settings=LLMSettings(model="scripted", **dict.fromkeys(unused)))
    backend = BackendLLMWorker(llm=scripted)
    llm = Live(
        api_key=API_KEY,
        base_url=url,
        settings=OpenAILiveLLMService.Settings(model=MODEL),
        delegation=OpenAILiveLLMService.ClientDelegation(backend=backend, timeout_secs=STEP),
    )
    task = PipelineWorker(
        Pipeline([llm, Sink()]),
        params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE),
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)

    async def converse() -> None:
        stop = asyncio.Event()
        context = LLMContext([{"role": "system", "content": INSTRUCTIONS}])
        await task.queue_frame(LLMContextFrame(context))
        await heard.until("session.started")

        async def push(chunk: bytes) -> None:
            await task.queue_frame(
                InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
            )

        mic = asyncio.ensure_future(stream(push, stop))
        try:
            await heard.until("session.delegation.created")
            appended = await heard.until("session.commentary.appended")
            await heard.relayed(appended, COMMENTARY)
        finally:
            stop.set()
            await mic
        await task.queue_frame(EndFrame())

    await asyncio.wait_for(asyncio.gather(runner.run(), converse()), 4 * STEP)
    assert heard.failure is None, heard.failure
    assert not errors, errors
    return {**heard.record(), "requests": requests}


def main(argv: list[str]) -> None:
    (url,) = argv  # Pipecat takes the endpoint's whole address
    print(json.dumps(asyncio.run(_conversation(url))))


if __name__ == "__main__":
    main(sys.argv[1:])
