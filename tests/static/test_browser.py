"""The browser client (realtime/static/) in headless Chromium against ``realtime serve``.

Chromium's fake media flags feed a WAV this test writes as the microphone. The
Chromium tests skip when /usr/bin/chromium (or $REALTIME_CHROMIUM) or Playwright
is missing, unless REALTIME_REQUIRE_BROWSER=1 (CI), where that is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import trio_websocket

from tests.helpers import REPO, ServerProcess, start_realtime_server

STATIC = REPO / "realtime" / "static"
CHROMIUM = Path(os.environ.get("REALTIME_CHROMIUM", "/usr/bin/chromium"))
API_KEY = "test-key-0123"
SPOKEN = "Hello. What is the weather like today?"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
]


def _need_browser() -> Any:
    """The Playwright sync API, or skip (fail under REALTIME_REQUIRE_BROWSER=1)."""
    problems = []
    if not CHROMIUM.exists():
        problems.append(f"{CHROMIUM} not found (apt-get install chromium)")
    sync_api: Any = None
    try:
        from playwright import sync_api
    except ImportError:
        problems.append("playwright is not installed (pip install playwright)")
    if problems:
        reason = "browser test needs Chromium and Playwright: " + "; ".join(problems)
        if os.environ.get("REALTIME_REQUIRE_BROWSER") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return sync_api


def _artifacts(tmp_path: Path) -> Path:
    root = os.environ.get("REALTIME_TEST_ARTIFACTS")
    path = Path(root) if root else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


def _tone_wav(path: Path) -> Path:
    """Four seconds of a warbling tone plus some noise at 48 kHz."""
    rate = 48_000
    t = np.arange(4 * rate) / rate
    tone = 0.25 * np.sin(2 * np.pi * (300 + 80 * np.sin(2 * np.pi * 2 * t)) * t)
    x = tone + 0.03 * np.random.default_rng(0).standard_normal(t.size)
    soundfile.write(str(path), x.astype(np.float32), rate, subtype="PCM_16")
    return path


def _speech_mic_wav(path: Path) -> Path:
    """A spoken question (espeak-ng) and a pause, at 48 kHz, in a room with some noise:
    what the fake microphone says, over and over (Chromium loops the file). The demo
    answers in the pause (its scripted turn, about 0.6 s after the speech ends); the
    room's noise keeps the pause from reading as a silent microphone. Without
    espeak-ng, the warbling tone stands in."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        return _tone_wav(path)
    spoken = path.with_name("espeak.wav")
    subprocess.run([espeak, "-w", str(spoken), SPOKEN], check=True, timeout=60)
    x, rate = soundfile.read(str(spoken), dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    out_rate = 48_000
    t = np.arange(int(x.size * out_rate / rate)) / out_rate
    speech = np.interp(t, np.arange(x.size) / rate, x)
    pause = np.zeros(int(2.6 * out_rate))  # the demo's answer (about 1.6 s) fits in it
    y = np.concatenate([speech, pause])
    y = y + 0.03 * np.random.default_rng(0).standard_normal(y.size)
    soundfile.write(str(path), y.astype(np.float32), out_rate, subtype="PCM_16")
    return path


def _silent_mic_wav(path: Path) -> Path:
    """Four seconds of digital silence: a microphone that is muted at the source."""
    soundfile.write(str(path), np.zeros(4 * 48_000, dtype=np.float32), 48_000, subtype="PCM_16")
    return path


@pytest.fixture(scope="module")
def key_server(
    tmp_path_factory: pytest.TempPathFactory, demo_cache_dir: Path
) -> Iterator[ServerProcess]:
    with start_realtime_server(
        "--api-key", API_KEY, log_dir=tmp_path_factory.mktemp("key-server")
    ) as server:
        yield server


class _Browser:
    def __init__(self, sync_api: Any, mic_wav: Path, profile: Path) -> None:
        self._pw = sync_api.sync_playwright().start()
        self.context = self._pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={mic_wav}"],
        )
        self.page_errors: list[str] = []

    def new_page(self) -> Any:
        page = self.context.new_page()
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))
        return page

    def close(self) -> None:
        self.context.close()
        self._pw.stop()


def _open_browser(mic_wav: Callable[[Path], Path], tmp_path: Path) -> Iterator[_Browser]:
    sync_api = _need_browser()
    profile = Path(tempfile.mkdtemp(prefix="realtime-chromium-"))
    b = _Browser(sync_api, mic_wav(tmp_path / "mic.wav"), profile)
    try:
        yield b
    finally:
        b.close()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[_Browser]:
    """Chromium whose fake microphone speaks (espeak-ng)."""
    yield from _open_browser(_speech_mic_wav, tmp_path)


@pytest.fixture
def silent_browser(tmp_path: Path) -> Iterator[_Browser]:
    """Chromium whose fake microphone delivers only digital silence."""
    yield from _open_browser(_silent_mic_wav, tmp_path)


def _stats(page: Any) -> dict[str, str]:
    result: dict[str, str] = page.eval_on_selector("#stats", "e => ({...e.dataset})")
    return result


def _wait_stat(page: Any, name: str, at_least: int, timeout_ms: int = 30_000) -> None:
    page.wait_for_function(
        f"() => Number(document.getElementById('stats').dataset.{name}) >= {at_least}",
        timeout=timeout_ms,
    )


def _wait_state(page: Any, state: str, timeout_ms: int = 30_000) -> None:
    page.wait_for_selector(f'#state[data-state="{state}"]', timeout=timeout_ms)


def _meters(page: Any) -> tuple[int, int]:
    values: list[str] = page.eval_on_selector_all(
        "#meter-in, #meter-out", "els => els.map(e => e.getAttribute('aria-valuenow'))"
    )
    return int(values[0]), int(values[1])


def _cut(page: Any) -> None:
    """Stop (the answer starts finishing), Stop again (it is cut), and the close."""
    page.click("#stop")
    _wait_state(page, "finishing", 15_000)
    page.click("#stop")
    _wait_state(page, "closed", 30_000)
    assert "cut" in page.text_content("#state")
    assert _stats(page)["finishedBy"] == "cut"


# What a figure that is not measured shows; its data-* attribute is absent then.
DASH = "\u2014"
# The page's WebSocket, with its query (?resumable=1: the page asks for resume).
REALTIME_SOCKET = re.compile(r"/v1/realtime(\?.*)?$")
LIVE_FIGURES = (
    "latencyMs",
    "targetMs",
    "bufferedMs",
    "rttMs",
    "rtf",
    "inputLevelDb",
    "outputLevelDb",
)


def _wav_header(data: bytes) -> tuple[int, int, int, int]:
    """(channels, sample rate, bits per sample, frames) of a PCM WAV."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
    pos, fmt, frames = 12, None, -1
    while pos + 8 <= len(data):
        chunk, size = data[pos : pos + 4], struct.unpack_from("<I", data, pos + 4)[0]
        if chunk == b"fmt ":
            fmt = struct.unpack_from("<HHIIHH", data, pos + 8)
        elif chunk == b"data":
            assert fmt is not None
            frames = size // fmt[4]
            assert pos + 8 + size == len(data)
        pos += 8 + size + (size & 1)
    assert fmt is not None and fmt[0] == 1  # PCM
    return fmt[1], fmt[2], fmt[5], frames


def _blob_bytes(page: Any, url: str) -> bytes:
    data: list[int] = page.evaluate(
        "async (u) => Array.from(new Uint8Array(await (await fetch(u)).arrayBuffer()))", url
    )
    return bytes(data)


# Each append's send and each audio delta's arrival on the page's clock, and the
# moments the underrun count rose: where the playback's underruns come from.
ARRIVALS = """
(() => {
  const trace = (window.__arrivals = { sent: [], received: [], underruns: [] });
  const Socket = window.WebSocket;
  window.WebSocket = class extends Socket {
    constructor(...args) {
      super(...args);
      this.addEventListener("message", (e) => {
        if (typeof e.data === "string" && e.data.includes('"response.audio.delta"')) {
          trace.received.push(performance.now());
        }
      });
    }
    send(data) {
      if (typeof data === "string" && data.includes('"input_audio_buffer.append"')) {
        trace.sent.push(performance.now());
      }
      return super.send(data);
    }
  };
  let seen = 0;
  setInterval(() => {
    const count = Number(document.getElementById("stats")?.dataset.underruns || 0);
    if (count > seen) trace.underruns.push(performance.now());
    seen = Math.max(seen, count);
  }, 20);
})();
"""


def _arrival_figures(trace: dict[str, list[float]]) -> dict[str, Any]:
    """How late the page sent its frames (against an even 80 ms clock), how long the
    server took to answer each, how late each answer frame arrived for its place in
    the stream, and when (seconds into the call) the underruns came."""
    sent, received = np.array(trace["sent"]), np.array(trace["received"])
    n = min(sent.size, received.size)
    if n < 2:
        return {"frames": n}

    def late(times: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        offset = times - np.arange(times.size) * 80.0
        lateness: np.ndarray[Any, Any] = offset - offset.min()
        return lateness

    rtt = received[:n] - sent[:n]
    return {
        "frames": n,
        "send late ms p90/max": [round(float(np.percentile(late(sent), q))) for q in (90, 100)],
        "server round trip ms p50/p90/max": [
            round(float(np.percentile(rtt, q))) for q in (50, 90, 100)
        ],
        "arrival late ms p90/max": [
            round(float(np.percentile(late(received), q))) for q in (90, 100)
        ],
        "underruns at s": [round(float(t - sent[0]) / 1000, 1) for t in trace["underruns"]],
    }


@pytest.mark.browser
@pytest.mark.slow
def test_browser_page_streams_in_headless_chromium(
    demo_server: ServerProcess, browser: _Browser, tmp_path: Path
) -> None:
    """A whole exchange: the fake microphone asks its question, the conversation grows,
    a second tab is told the server is full and waits for the slot, Stop lets the
    answer finish before the session ends, and every turn plays again."""
    artifacts = _artifacts(tmp_path)
    page = browser.new_page()
    page.add_init_script(ARRIVALS)
    page.set_viewport_size({"width": 1100, "height": 900})
    page.goto(demo_server.http + "/")
    # The served model's name, and the demo checkpoint's banner.
    page.wait_for_function("() => document.getElementById('model').dataset.modelId !== ''")
    model_id = page.get_attribute("#model", "data-model-id")
    assert model_id and model_id.startswith("realtime-demo")
    assert page.text_content("#model") == model_id
    assert page.is_visible("#demo-banner") and "noise" in page.text_content("#demo-banner")
    assert page.is_visible("#start") and page.is_disabled("#stop")
    # Before any session no figure is invented: every one reads a dash.
    page.click("#diagnostics summary")
    for stat in ("rtt", "latency", "rtf", "underruns", "caught-up", "dropped", "frames"):
        assert page.text_content(f"#stat-{stat}") == DASH, stat
    idle = _stats(page)
    assert idle["phase"] == "none" and not set(LIVE_FIGURES) & set(idle)
    page.click("#diagnostics summary")
    # Settings, one click away: an empty prompt sends no system_prompt at all.
    page.click("#settings-panel summary")
    assert "no system_prompt" in (page.get_attribute("#system-prompt", "placeholder") or "")
    assert page.text_content("#update-preview") == '{"type":"session.update","session":{"seed":0}}'
    page.fill("#system-prompt", "Be concise.")
    page.fill("#seed", "5")
    page.fill("#answer-limit", "4")
    page.uncheck("#echo")  # no noise suppression: the room's noise reaches the model
    assert '"system_prompt":"Be concise."' in page.text_content("#update-preview")
    summary = page.text_content("#settings-summary")
    assert "answer up to 4 s after Stop" in summary and "echo cancellation off" in summary
    page.screenshot(path=str(artifacts / "browser-idle.png"), full_page=True)
    page.click("#settings-panel summary")

    page.click("#start")
    _wait_state(page, "live")
    assert page.text_content("#state") == "live: speak now"
    _wait_stat(page, "audioDeltas", 12)
    stats = _stats(page)
    assert stats["sessionId"].startswith("sess_")
    assert int(stats["appendsSent"]) >= 12
    # The spoken question reaches the encoder (the meter reads the live level).
    page.wait_for_function(
        "() => Number(document.getElementById('meter-in').getAttribute('aria-valuenow')) > -40",
        timeout=15_000,
    )
    # The demo takes its turns: your words (its transcript, "(demo) speech...") and its
    # scripted answer, in turns that are whole (the conversation grows; it is no
    # scroll box).
    page.wait_for_selector("#conversation li.turn.user", timeout=30_000)
    page.wait_for_selector("#conversation li.turn.assistant", timeout=30_000)
    assert page.text_content("#user-transcript").strip()
    assert page.text_content("#assistant-text").strip()
    assert page.text_content("#conversation li.turn.user p").strip()
    assert page.text_content("#conversation li.turn.assistant p").strip()
    box = page.evaluate(
        "() => { const c = document.getElementById('conversation');"
        " const first = c.firstElementChild.getBoundingClientRect();"
        " return { overflow: getComputedStyle(c).overflowY, scroll: c.scrollHeight,"
        " client: c.clientHeight, top: first.top - c.getBoundingClientRect().top }; }"
    )
    assert box["overflow"] == "visible" and box["scroll"] <= box["client"] + 1, box
    assert box["top"] >= 0, box
    assert page.is_hidden("#mic-warning")  # the microphone speaks

    # Diagnostics, one click away: meters move, and the live figures are measured.
    page.click("#diagnostics summary")
    # Read for longer than the microphone file's 2.6 s pause, whose steady room noise
    # reads one whole-dB level throughout: the speech comes round within the window.
    seen_in = set()
    for _ in range(40):
        level_in, _ = _meters(page)
        seen_in.add(level_in)
        if len(seen_in) >= 2:
            break
        page.wait_for_timeout(120)
    assert len(seen_in) >= 2, seen_in
    # The output meter moves while the demo answers (it is silent between answers).
    page.wait_for_function(
        "() => Number(document.getElementById('meter-out').getAttribute('aria-valuenow')) > -60",
        timeout=15_000,
    )
    page.wait_for_function(
        "() => { const d = document.getElementById('stats').dataset;"
        " return Number(d.rttMs) >= 0 && Number(d.rtf) > 0 && Number(d.targetMs) > 0; }",
        timeout=10_000,
    )
    figures = _stats(page)
    assert figures["phase"] == "active"
    assert 0 <= float(figures["rttMs"]) < 5000
    assert 0.3 < float(figures["rtf"]) < 2.0
    assert 50 <= float(figures["targetMs"]) <= 600
    # What was removed from the answer, each by its own name (the jitter scenarios
    # below show which is which); measured from the first report on.
    assert float(figures["droppedMs"]) >= 0 and float(figures["caughtUpMs"]) >= 0
    assert int(figures["underruns"]) >= 0
    assert page.text_content("#stat-rtt").endswith(")") and "ms" in page.text_content("#stat-rtt")
    assert "(target " in page.text_content("#stat-latency")
    assert page.text_content("#stat-rtf").endswith("\u00d7")
    assert page.text_content("#stat-dropped").endswith(" ms")
    assert page.text_content("#stat-caught-up").endswith(" ms")
    page.click("#log-panel summary")
    log = page.text_content("#log")
    assert "response.audio.delta \u00d7" in log and "session.update" in log
    assert page.locator("#log li").count() <= 300
    page.screenshot(path=str(artifacts / "browser-live.png"), full_page=True)

    # A second tab while the first is live: told the server is busy (server_busy,
    # close 1013), in the server's own words, with Try again.
    second = browser.new_page()
    second.set_viewport_size({"width": 1100, "height": 700})
    second.goto(demo_server.http + "/")
    second.click("#start")
    _wait_state(second, "busy", 15_000)
    assert "busy" in second.text_content("#state")
    assert second.is_visible("#notice") and "busy" in second.text_content("#notice")
    assert second.is_visible("#retry")
    second.click("#diagnostics summary")
    assert "server_busy" in second.text_content("#errors")
    told = second.text_content("#errors").split("server_busy: ", 1)[1].strip()
    assert told and told[0].upper() + told[1:] in second.text_content("#notice-text")
    second.wait_for_function(
        "() => document.getElementById('stats').dataset.closeCode === '1013'", timeout=10_000
    )
    second.click("#diagnostics summary")
    second.screenshot(path=str(artifacts / "browser-busy.png"), full_page=True)
    # Try again: /ready says busy, so the tab waits and asks again, visibly.
    second.click("#retry")
    second.wait_for_selector('#notice[data-kind="waiting"]', timeout=10_000)
    _wait_state(second, "waiting", 5_000)
    assert "Trying again in" in second.text_content("#notice-text")
    assert second.is_visible("#retry-cancel") and second.is_enabled("#stop")
    second.screenshot(path=str(artifacts / "browser-busy-waiting.png"), full_page=True)

    # Stop ends the turn, not the call: the microphone goes off, silence goes out,
    # the answer goes on; a second Stop would cut it.
    page.click("#stop")
    _wait_state(page, "finishing", 10_000)
    assert page.text_content("#stop") == "Cut the answer" and page.is_enabled("#stop")
    assert "finishing" in page.text_content("#state") and "finishing" in page.text_content("#hint")
    page.screenshot(path=str(artifacts / "browser-stop-finishing.png"), full_page=True)
    assert "inputLevelDb" not in _stats(page)  # the microphone is off: no level to show
    _wait_state(page, "closed", 30_000)
    final = _stats(page)
    assert final["closeCode"] == "1000"
    assert final["finishedBy"] in ("quiet", "limit")  # the demo's noise never goes quiet
    assert int(final["silenceSent"]) >= 3  # silence went out after Stop ...
    assert int(final["lastFrameIndex"]) >= int(final["stopFrame"]) + 2  # ... and was answered
    assert int(final["audioDeltas"]) == int(final["lastFrameIndex"]) + 1
    assert int(final["audioDeltas"]) >= int(final["appendsSent"])
    assert "finished" in page.text_content("#state")
    assert page.text_content("#errors").strip() == ""
    assert "of silence each, after Stop" in page.text_content("#log")
    # Once the speakers are released nothing live reads a value; the totals stay.
    page.wait_for_function(
        "() => !('bufferedMs' in document.getElementById('stats').dataset)", timeout=15_000
    )
    ended = _stats(page)
    assert ended["phase"] == "ended" and not set(LIVE_FIGURES) & set(ended), ended
    assert page.text_content("#stat-latency") == DASH
    assert page.text_content("#stat-rtf") == DASH
    assert page.text_content("#stat-rtt").startswith(DASH + " (median ")
    assert "underruns" in ended and page.text_content("#stat-dropped").endswith(" ms")
    played = {k: final.get(k) for k in ("underruns", "caughtUpMs", "droppedMs")}
    played |= {f"live {k}": figures.get(k) for k in ("targetMs", "latencyMs", "bufferedMs")}
    print(f"\nplayback in the plain exchange: {played}")  # figures, not asserts
    arrivals = _arrival_figures(page.evaluate("() => window.__arrivals"))
    print(f"frames in the plain exchange: {arrivals}")

    # Every turn plays again: a mono WAV of its stretch of the timeline.
    replays = page.locator("#conversation .turn .replay")
    assert replays.count() >= 1
    assert replays.count() == page.locator("#conversation .turn").count()
    for i in range(replays.count()):
        button = replays.nth(i)
        assert int(button.get_attribute("data-duration-ms") or 0) > 0
        role = "user" if "user" in button.evaluate("b => b.closest('.turn').className") else "x"
        channels, rate, _, frames = _wav_header(
            _blob_bytes(page, button.get_attribute("data-src") or "")
        )
        assert channels == 1 and rate == (16_000 if role == "user" else 22_050)
        assert frames == round(int(button.get_attribute("data-duration-ms") or 0) * rate / 1000)
    replays.first.click()
    page.wait_for_selector('.replay[aria-pressed="true"]', timeout=10_000)

    # Downloads: a stereo WAV (mic | model) on the frame timeline, and the transcript.
    page.wait_for_selector("#downloads:not([hidden])")
    with page.expect_download() as wav_download:
        page.click("#download-wav")
    wav = Path(wav_download.value.path()).read_bytes()
    channels, rate, bits, frames = _wav_header(wav)
    assert (channels, rate, bits) == (2, 22050, 16)
    assert frames == int(final["audioDeltas"]) * 1764
    pcm = np.frombuffer(wav[44:], dtype="<i2").reshape(-1, 2)
    assert np.abs(pcm[:, 0]).max() > 1000  # the fake microphone's voice
    assert np.abs(pcm[:, 1]).max() > 100  # the model's audio
    with page.expect_download() as md_download:
        page.click("#download-md")
    markdown = Path(md_download.value.path()).read_text()
    assert markdown.startswith(f"# Conversation with {model_id}")
    assert "**You**" in markdown or "**Assistant**" in markdown
    page.click("#diagnostics summary")
    page.screenshot(path=str(artifacts / "browser-finished.png"), full_page=True)

    # With the first session over, the waiting tab gets the slot by itself; a Stop
    # and a second Stop cut its answer.
    _wait_state(second, "live", 30_000)
    _wait_stat(second, "audioDeltas", 2)
    assert second.is_hidden("#notice")
    _cut(second)
    assert second.text_content("#errors").strip() == ""
    second.screenshot(path=str(artifacts / "browser-second-tab.png"), full_page=True)
    assert browser.page_errors == []


@pytest.mark.browser
@pytest.mark.slow
def test_browser_warns_of_a_silent_microphone(
    demo_server: ServerProcess, silent_browser: _Browser, tmp_path: Path
) -> None:
    """A capture device that delivers only silence: the page says so within seconds,
    in a banner and in the badge, while the session stays live."""
    artifacts = _artifacts(tmp_path)
    page = silent_browser.new_page()
    page.set_viewport_size({"width": 1100, "height": 700})
    page.goto(demo_server.http + "/")
    page.click("#start")
    _wait_state(page, "live", 15_000)
    page.wait_for_selector("#mic-warning:not([hidden])", timeout=15_000)
    assert page.get_attribute("#mic-warning", "data-kind") == "silent"
    assert "silence" in page.text_content("#mic-warning")
    assert page.text_content("#state") == "live: the microphone is silent"
    assert page.get_attribute("#state", "data-state") == "live"
    assert int(_stats(page)["inputLevelDb"]) <= -80
    page.screenshot(path=str(artifacts / "browser-silent-microphone.png"), full_page=True)
    _cut(page)
    assert page.is_hidden("#mic-warning")
    assert silent_browser.page_errors == []


# Scripted deliveries of 80 ms frames into realtime/static/jitter.js at 48 kHz,
# pulled in 128-sample render quanta; returns each run's trace
# [t_ms, latency_ms, target_ms, underruns, buffered_ms] every ~10 ms.
JITTER_SCENARIOS = """
async (url) => {
  const { JitterBuffer } = await import(url);
  const rate = 48000, quantum = 128, frame = 3840; // 80 ms at 48 kHz
  const voice = (i) => {  // a voiced 140 Hz buzz with a gliding pitch and a tremolo
    const t = i / rate, f = 140 + 20 * Math.sin(2 * Math.PI * 0.7 * t);
    let x = 0;
    for (let h = 1; h <= 6; h++) x += Math.sin(2 * Math.PI * f * h * t) / h;
    return 0.2 * x * (0.6 + 0.4 * Math.sin(2 * Math.PI * 3 * t));
  };
  function run(arrivals, durationMs) {  // arrivals: [[time_ms, frames], ...] in order
    const jb = new JitterBuffer({ rate });
    const out = new Float32Array(quantum);
    const trace = [];
    let next = 0, produced = 0, tMs = 0, q = 0;
    while (tMs < durationMs) {
      while (next < arrivals.length && arrivals[next][0] <= tMs) {
        const chunk = new Float32Array(arrivals[next][1] * frame);
        for (let i = 0; i < chunk.length; i++) chunk[i] = voice(produced + i);
        produced += chunk.length;
        jb.push(chunk);
        next += 1;
      }
      jb.pull(out);
      q += 1;
      tMs = (q * quantum * 1000) / rate;
      const s = jb.stats();
      if (q % 4 === 0) trace.push([tMs, s.latencyMs, s.targetMs, s.underruns, s.bufferedMs]);
    }
    const s = jb.stats();
    return { trace, underruns: s.underruns, droppedMs: s.droppedMs, caughtUpMs: s.caughtUpMs,
             targetMs: s.targetMs, latencyMs: s.latencyMs };
  }
  let seed = 1;
  const rand = () => (seed = (seed * 16807) % 2147483647) / 2147483647;
  const steady = [], stall = [], bursty = [], fast = [];
  for (let k = 0; k * 80 < 12000; k++) steady.push([20 + k * 80 + 10 * rand(), 1]);
  for (let k = 0; k * 80 < 14000; k++) {  // a 600 ms stall at 5 s, then its backlog
    const t = 20 + k * 80;
    stall.push([t >= 5000 && t < 5600 ? 5600 : t, 1]);
  }
  for (let k = 0; k * 240 < 14000; k++) bursty.push([20 + k * 240 + 40 * rand(), 3]);
  for (let k = 0; k * 78.4 < 14000; k++) fast.push([20 + k * 78.4, 1]);
  const jittery = [];  // each frame up to 250 ms late (a busy machine), in arrival order
  for (let k = 0; k * 80 < 14000; k++) jittery.push([20 + k * 80 + 250 * rand(), 1]);
  jittery.sort((a, b) => a[0] - b[0]);
  return { steady: run(steady, 12000), stall: run(stall, 14000), bursty: run(bursty, 14000),
           fast: run(fast, 14000), jittery: run(jittery, 14000), stallAt: 5600 };
}
"""


def _recovered_at(trace: list[list[float]], after_ms: float, within_ms: float) -> float:
    """The time from which latency stays within `within_ms` of the target."""
    last_off = after_ms
    for t, latency, target, *_ in trace:
        if t > after_ms and abs(latency - target) > within_ms:
            last_off = t
    return last_off


def _evaluate(server: ServerProcess, browser: _Browser, script: str, module: str) -> Any:
    """``script`` (an async function of a module's URL) run on the served page."""
    page = browser.new_page()
    page.goto(server.http + "/")
    return page.evaluate(script, module)


@pytest.mark.browser
def test_browser_jitter_buffer_scenarios(demo_server: ServerProcess, browser: _Browser) -> None:
    runs = _evaluate(demo_server, browser, JITTER_SCENARIOS, "/static/jitter.js")

    steady = runs["steady"]
    assert steady["underruns"] == 0
    assert steady["droppedMs"] == 0  # nothing discarded whole on a clean stream
    assert all(abs(p[1] - p[2]) <= 50 for p in steady["trace"] if p[0] > 1000)
    assert steady["targetMs"] <= 120

    # One 600 ms stall, then its backlog in one burst: one underrun, the target
    # rises, the excess is cut away within a few seconds, and the target decays.
    stall = runs["stall"]
    assert stall["underruns"] == 1
    burst = runs["stallAt"]
    peak_target = max(p[2] for p in stall["trace"])
    assert max(p[2] for p in stall["trace"] if p[0] > burst) > 200  # above the start's
    assert max(p[1] for p in stall["trace"] if p[0] > burst) > 300  # the backlog arrived
    assert _recovered_at(stall["trace"], burst, 50) - burst <= 3000
    assert stall["targetMs"] < peak_target and abs(stall["latencyMs"] - stall["targetMs"]) <= 50
    # The backlog is caught up (cut a pitch period at a time), not discarded whole.
    assert stall["caughtUpMs"] > 100 and stall["droppedMs"] == 0

    # Bursts of three frames every 240 ms: the target settles where bursts fit.
    bursty = runs["bursty"]
    assert bursty["underruns"] <= 2
    late = [p for p in bursty["trace"] if p[0] > 6000]
    assert all(abs(p[1] - p[2]) <= 60 for p in late)
    assert max(p[2] for p in late) <= 400

    # A sender 2 % faster than real time: latency does not accumulate.
    fast = runs["fast"]
    assert fast["underruns"] == 0
    assert all(abs(p[1] - p[2]) <= 50 for p in fast["trace"] if p[0] > 4000)

    # Frames up to 250 ms late throughout (a busy machine): the target follows their
    # lateness before it underruns (none from a 200 ms start, 1 from 120 ms; 2 without
    # the lateness estimate).
    jittery = runs["jittery"]
    assert jittery["underruns"] == 0 and jittery["droppedMs"] == 0
    assert browser.page_errors == []


@pytest.mark.browser
@pytest.mark.slow
def test_browser_with_api_key(key_server: ServerProcess, browser: _Browser) -> None:
    page = browser.new_page()
    page.goto(key_server.http + "/")  # the page itself needs no key
    page.wait_for_selector('#notice[data-kind="key"]')  # GET /v1/models said 401
    assert "API key" in page.text_content("#notice")
    page.click("#start")
    _wait_state(page, "unauthorized", 15_000)  # no key: the upgrade is refused
    assert "API key" in page.text_content("#notice")
    assert "401" in page.text_content("#errors")
    page.fill("#api-key", API_KEY)
    page.wait_for_function("() => document.getElementById('model').dataset.modelId !== ''")
    assert page.is_hidden("#notice")
    page.click("#start")
    _wait_state(page, "live", 15_000)
    _wait_stat(page, "audioDeltas", 2)
    _cut(page)
    assert browser.page_errors == []


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("src", "href") and value:
                self.refs.append(value)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


EXTERNAL_URL = re.compile(rb"""(?:https?|wss?)://(?!(?:127\.0\.0\.1|localhost)[:/])[^\s"'`)]+""")


def test_browser_page_served_offline(demo_server: ServerProcess) -> None:
    status, ctype, index = _get(demo_server.http + "/")
    assert status == 200 and "text/html" in ctype
    assert index == (STATIC / "index.html").read_bytes()
    parser = _Refs()
    parser.feed(index.decode())
    local = [r for r in parser.refs if not r.startswith("data:")]
    assert "/static/app.js" in local and "/static/style.css" in local
    files = sorted(p.name for p in STATIC.iterdir() if p.is_file())
    assert {"index.html", "app.js", "audio-worklet.js", "style.css"} <= set(files)
    for ref in local:
        assert ref.startswith("/static/"), f"index.html refers to {ref!r}"
        assert ref.removeprefix("/static/") in files
    for name in files:
        status, ctype, body = _get(f"{demo_server.http}/static/{name}")
        assert status == 200, name
        assert body == (STATIC / name).read_bytes(), name
        if name.endswith(".js"):  # module scripts and worklets need a JavaScript MIME type
            assert "javascript" in ctype, (name, ctype)
        found = EXTERNAL_URL.findall(body)
        assert not found, f"{name} refers to external URLs: {found}"
    # The worklet module the page loads at run time is among the served files.
    scripts = b"".join(path.read_bytes() for path in STATIC.glob("*.js"))
    assert b'addModule("/static/audio-worklet.js")' in scripts


async def test_browser_key_subprotocol_accepted(key_server: ServerProcess) -> None:
    async with trio_websocket.open_websocket_url(
        key_server.url, subprotocols=["realtime", f"realtime-key.{API_KEY}"]
    ) as ws:
        assert ws.subprotocol == "realtime"  # never the key
        assert b"realtime-key" not in b"".join(v for _, v in ws.handshake_headers)
        first = await ws.get_message()
        assert '"session.created"' in first
    for offered in (["realtime", "realtime-key.wrong"], ["realtime"]):
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with trio_websocket.open_websocket_url(key_server.url, subprotocols=offered):
                pass
        assert rejected.value.status_code == 401
    # The page and its files are public; the API is not.
    assert _get(key_server.http + "/")[0] == 200
    assert _get(key_server.http + "/static/app.js")[0] == 200
    assert _get(key_server.http + "/v1/models")[0] == 401
    auth = {"Authorization": f"Bearer {API_KEY}"}
    assert _get(key_server.http + "/v1/models", auth)[0] == 200


# The page's pure units, imported from the module the page itself runs.
APP_UNITS = """
async (url) => {
  const m = await import(url);
  const formats = {
    empty: m.sessionFormat(undefined),
    computed: m.sessionFormat({ frame_samples: 320, input_audio_format: { sample_rate: 8000 },
                                output_audio_format: { sample_rate: 24000 } }),
    given: m.sessionFormat({ frame_samples: 1280, output_frame_samples: 1000 }),
    junk: m.sessionFormat({ frame_samples: "1280", input_audio_format: { sample_rate: -1 } }),
  };
  const timing = new m.Timing(40);
  timing.sent(0, 1000);
  timing.sent(1, 1040);
  const first = timing.answered(0, 1100);
  const unknown = timing.answered(7, 2100);
  const format = formats.computed;
  const mic = [new Int16Array(320).fill(1000), new Int16Array(320).fill(1000)];
  const model = [new Int16Array(960).fill(-7), undefined, new Int16Array(960).fill(9)];
  const wav = new Uint8Array(m.conversationWav(mic, model, format));
  const recording = new m.Recording({ ...format, frameMs: 600000 });  // 3 frames in 30 min
  for (let i = 0; i < 5; i++) recording.addMic(new Int16Array(1));
  recording.addModel(2, new Int16Array(1));
  recording.addModel(3, new Int16Array(1));
  const list = document.createElement("ol"), counter = document.createElement("small");
  const log = new m.EventLog(list, counter, 3);
  for (let i = 0; i < 4; i++) log.append(40);
  log.audioFrame(5);
  log.audioFrame(6);
  log.event("←", "session.pong", "");
  log.event("←", "session.pong", "");
  const spanRecording = new m.Recording({ ...format, outputFrameSamples: 2 });
  spanRecording.addModel(0, new Int16Array([1, 1]));
  spanRecording.addModel(1, new Int16Array([2, 3]));
  spanRecording.addModel(3, new Int16Array([4, 5]));
  let illegal = null;
  try {
    m.advance("done", "live");
  } catch (err) {
    illegal = err.message;
  }
  return {
    states: m.CALL_STATES,
    illegal,
    walk: ["configuring", "live", "finishing", "committing", "committing", "done"].reduce(
      (from, to) => m.advance(from, to), "connecting"),
    formats, first, unknown,
    wav: Array.from(wav),
    micFirst: new DataView(wav.buffer).getInt16(44, true),
    modelFrames: [0, 960, 1920].map((j) => new DataView(wav.buffer).getInt16(46 + j * 4, true)),
    recorded: [recording.mic.length, recording.model.length, recording.empty],
    log: [...list.children].map((li) => li.textContent.replace(/^\\S+ /, "")),
    logCount: counter.textContent,
    fn: m.formatFunction('{"a": 1}\\nnot json'),
    update: m.sessionUpdate("  Hi. ", "-3"),
    sentences: [m.sentence("all 2 conversations are in use; try again"), m.sentence(" Full! "),
                m.sentence("")],
    micWatch: micWatch(),
    answer: answer(),
    retryAfter: [m.parseRetryAfter("5"), m.parseRetryAfter(" 0 "), m.parseRetryAfter(null),
                 m.parseRetryAfter("soon"), m.parseRetryAfter("99999999"),
                 m.parseRetryAfter("Wed, 21 Oct 2015 07:28:10 GMT",
                                   Date.UTC(2015, 9, 21, 7, 28, 0))],
    limits: ["10", "0", "2.5", "-1", "", "600"].map(m.answerLimitSeconds),
    spans: [
      m.turnSpan({ role: "user", frame: 20, last: 30 }, 80, 100, 100),
      m.turnSpan({ role: "user", frame: 2, last: 40 }, 80, 35, 100),
      m.turnSpan({ role: "assistant", frame: 20, last: 30 }, 80, 100, 100),
      m.turnSpan({ role: "assistant", frame: 20, last: 30 }, 80, 100, 25),
      m.turnSpan({ role: "assistant", frame: 20, last: 30 }, 80, 100, 20),
      m.turnSpan({ role: "user", frame: -1, last: null }, 80, 100, 100),
    ],
    span: Array.from(spanRecording.span("assistant", 1, 4)),
    mono: Array.from(new Uint8Array(m.monoWav(new Int16Array([1, -2, 3]), 16000))),
    levels: [m.levelDb(new Int16Array(100)), Math.round(m.levelDb(new Int16Array(100).fill(3277)))],
    reasons: ["busy", "draining", "nonsense"].map((r) => m.readyReason(r)),
  };
  function micWatch() {
    const w = new m.MicWatch(0);  // 2 s; silence below -80 dBFS
    const seen = [w.check(1999)];
    w.frame(-30, 500);
    seen.push(w.check(2400));  // sound at 0.5 s: fine until 2.5 s
    for (let t = 600; t <= 2600; t += 100) w.frame(-120, t);
    seen.push(w.check(2600));  // frames, but silent since 0.5 s
    w.frame(-50, 2700);
    seen.push(w.check(2700));  // sound again
    seen.push(w.check(4700));  // no frame for 2 s
    return seen;
  }
  function answer() {
    // 80 ms frames, Stop after frame 9 (appends 0..9 were speech), a 10 s bound.
    const a = new m.AnswerWatch(80, 10, 0, 10000, { quietMs: 400, quietDb: -50 });
    const seen = [];
    a.audio(8, -120);  // a quiet frame from before Stop does not count
    for (let k = 10; k < 14; k++) a.audio(k, -120);
    seen.push(a.verdict(100));  // 4 quiet frames of 5
    a.token(13);  // a word at frame 13: the quiet starts again after it
    a.audio(14, -120);
    seen.push(a.verdict(200));
    a.audio(15, -20);  // speech at 15
    for (let k = 16; k < 20; k++) a.audio(k, -120);
    seen.push(a.verdict(300));
    a.audio(20, -120);
    seen.push(a.verdict(400));  // 16..20: quiet
    const b = new m.AnswerWatch(80, 10, 0, 10000);
    b.audio(10, -10);
    seen.push(b.verdict(9999), b.verdict(10000));  // never quiet: the bound
    return seen;
  }
}
"""


@pytest.mark.browser
def test_browser_app_units(demo_server: ServerProcess, browser: _Browser) -> None:
    units = _evaluate(demo_server, browser, APP_UNITS, "/static/app.js")
    # The call's phases change only along one table.
    assert set(units["states"]) == {
        "connecting",
        "configuring",
        "live",
        "finishing",
        "committing",
        "reconnecting",
        "done",
    }
    assert units["states"]["done"] == [] and units["walk"] == "done"
    assert units["illegal"] == "a call cannot go from done to live"
    formats = units["formats"]
    assert formats["empty"] == {
        "frameSamples": 1280,
        "inputRate": 16000,
        "outputRate": 22050,
        "outputFrameSamples": 1764,
        "frameMs": 80,
    }
    assert formats["computed"]["outputFrameSamples"] == 960 and formats["computed"]["frameMs"] == 40
    assert formats["given"]["outputFrameSamples"] == 1000  # the server's word wins
    assert formats["junk"] == formats["empty"]
    assert units["first"] == {"rttMs": 100, "rttMedianMs": 100}
    assert units["unknown"] == {"rtf": pytest.approx(2 * 40 / 1100)}  # no rtt: never sent
    # Three output frames of 960 at 24 kHz; the microphone resampled from 8 kHz.
    assert _wav_header(bytes(units["wav"])) == (2, 24_000, 16, 3 * 960)
    assert units["micFirst"] == 1000 and units["modelFrames"] == [-7, 0, 9]
    assert units["recorded"] == [3, 3, False]
    assert units["log"] == [
        "\u2190 response.audio.delta \u00d72 (frames 5\u20136)",
        "\u2190 session.pong",
        "\u2190 session.pong",
    ]
    assert units["logCount"] == "(4)"  # entries made; the list keeps the last 3
    assert units["fn"] == '{\n  "a": 1\n}\nnot json'  # pretty-printed line by line
    assert units["update"] == {
        "type": "session.update",
        "session": {"system_prompt": "Hi.", "seed": 0},
    }
    assert units["sentences"] == ["All 2 conversations are in use; try again.", "Full!", ""]
    assert units["micWatch"] == [None, None, "silent", None, "nothing"]
    assert units["answer"] == [None, None, None, "quiet", None, "limit"]
    assert units["retryAfter"] == [5, 0, None, None, None, 10]
    assert units["limits"] == [10, 0, 2.5, 10, 10, 60]
    # 500 ms before a user turn's first word (6 frames of 80 ms), up to its last;
    # an answer from its first token to 1 s (13 frames, rounded) after its last;
    # clipped to what was recorded.
    assert units["spans"] == [
        {"first": 14, "end": 31},
        {"first": 0, "end": 35},
        {"first": 20, "end": 44},
        {"first": 20, "end": 25},
        None,
        None,
    ]
    assert units["span"] == [2, 3, 0, 0, 4, 5]  # frame 2 was never received: silence
    mono = bytes(units["mono"])
    assert _wav_header(mono) == (1, 16_000, 16, 3)
    assert np.frombuffer(mono[44:], "<i2").tolist() == [1, -2, 3]
    assert units["levels"] == [-120, -20]
    assert "in use" in units["reasons"][0] and "shutting down" in units["reasons"][1]
    assert units["reasons"][2] == ""
    assert browser.page_errors == []


class _FiguresServer:
    """Stands in for the server behind the page's WebSocket, announcing other figures
    than VoiceChat's in session.updated: 40 ms frames of 320 samples at 8 kHz in,
    24 kHz out (no output_frame_samples: the page works out 960). It answers each
    append with a frame: a tone, or silence for a silent append."""

    FRAME, IN_RATE, OUT_RATE, OUT_FRAME = 320, 8_000, 24_000, 960

    def __init__(self) -> None:
        self.appends: list[tuple[int, int]] = []  # (sample_rate, samples) of each append
        self.silent_appends = 0
        self.committed = False
        self._ws: Any = None

    def route(self, ws: Any) -> None:
        self._ws = ws
        ws.on_message(self._on_message)
        self._send({"type": "session.created", "session": {"id": "sess_figures"}})

    def _send(self, event: dict[str, Any]) -> None:
        self._ws.send(json.dumps(event))

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        if event["type"] == "session.update":
            session = {
                "id": "sess_figures",
                "frame_samples": self.FRAME,
                "input_audio_format": {"type": "pcm16", "sample_rate": self.IN_RATE},
                "output_audio_format": {"type": "pcm16", "sample_rate": self.OUT_RATE},
            }
            self._send({"type": "session.updated", "session": session})
        elif event["type"] == "input_audio_buffer.append":
            self._answer(event)
        elif event["type"] == "input_audio_buffer.commit":
            self.committed = True
            self._send({"type": "input_audio_buffer.committed"})
            self._send({"type": "response.done", "frame_index": len(self.appends)})
            self._ws.close(code=1000)
        elif event["type"] == "response.cancel":
            self._send({"type": "response.cancelled", "frame_index": len(self.appends)})
            self._ws.close(code=1000)

    def _answer(self, append: dict[str, Any]) -> None:
        index = len(self.appends)
        self.appends.append((append["sample_rate"], len(base64.b64decode(append["audio"])) // 2))
        t = np.arange(self.OUT_FRAME) / self.OUT_RATE
        tone = (3000 * np.sin(2 * np.pi * 440 * t)).astype("<i2")
        if not np.frombuffer(base64.b64decode(append["audio"]), "<i2").any():
            tone[:] = 0  # silence in (the page's, after Stop): silence out, no words
            self.silent_appends += 1
        delta = base64.b64encode(tone.tobytes()).decode()
        audio = {"frame_index": index, "delta": delta, "sample_rate": self.OUT_RATE}
        self._send({"type": "response.audio.delta", **audio})
        if index == 2:  # a turn at frame 25: 1.0 s on a 40 ms timeline
            transcript = {"frame_index": 25, "delta": "hello", "transcript": "hello"}
            self._send({"type": "conversation.item.input_audio_transcription.delta", **transcript})


@pytest.mark.browser
def test_browser_page_follows_the_session_figures(
    demo_server: ServerProcess, browser: _Browser
) -> None:
    """Appends, the answer's playback, the timeline and the download all use the frame
    and the rates session.updated states, not VoiceChat's. After Stop the answer goes
    quiet (silence answered with silence): the page commits without waiting out the
    bound."""
    server = _FiguresServer()
    page = browser.new_page()
    page.route_web_socket(REALTIME_SOCKET, server.route)
    page.goto(demo_server.http + "/")
    page.click("#start")
    _wait_state(page, "live", 15_000)
    _wait_stat(page, "audioDeltas", 6, 15_000)
    page.click("#stop")
    _wait_state(page, "closed", 15_000)
    assert "finished" in page.text_content("#state") and server.committed
    final = _stats(page)
    assert final["finishedBy"] == "quiet"
    # 1.5 s of quiet answers is 38 frames of 40 ms (a few more may be on their way).
    assert 38 <= int(final["silenceSent"]) <= server.silent_appends, final
    assert server.appends and all(a == (server.IN_RATE, server.FRAME) for a in server.appends)
    assert "(40 ms PCM16 each)" in page.text_content("#log")
    assert "(40 ms of silence each, after Stop)" in page.text_content("#log")
    assert "You · at 1.0 s" in page.text_content("#conversation")
    assert int(final["audioDeltas"]) == len(server.appends) == int(final["lastFrameIndex"]) + 1
    page.wait_for_selector("#downloads:not([hidden])")
    with page.expect_download() as wav_download:
        page.click("#download-wav")
    wav = Path(wav_download.value.path()).read_bytes()
    assert _wav_header(wav) == (2, server.OUT_RATE, 16, len(server.appends) * server.OUT_FRAME)
    with page.expect_download() as json_download:
        page.click("#download-json")
    record = json.loads(Path(json_download.value.path()).read_text())
    assert record["frame_ms"] == 40 and record["turns"][0]["start_s"] == 1.0
    assert page.text_content("#errors").strip() == ""
    assert browser.page_errors == []


class _FullFront:
    """Stands in for a balancer whose every replica is full: it serves the page and
    /v1/models, answers the WebSocket upgrade with HTTP 503 and ``Retry-After`` before
    any upgrade (as HAProxy's errors/503.http does), and /ready with 503 ``busy`` and
    ``Retry-After: 1`` the first ``busy_readies`` times, then 200."""

    TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
    BUSY_BODY = json.dumps(
        {"error": {"code": "server_busy", "message": "no realtime replica is free"}}
    ).encode()

    def __init__(self, busy_readies: int) -> None:
        self.busy_readies = busy_readies
        self.readies = 0
        self.upgrades = 0
        front = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                front.get(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _FullFront:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def get(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?", 1)[0]
        if path == "/v1/realtime":
            self.upgrades += 1
            self._reply(h, 503, self.BUSY_BODY, "application/json", {"Retry-After": "5"})
        elif path == "/ready":
            self.readies += 1
            if self.readies <= self.busy_readies:
                body = json.dumps({"status": "not_ready", "reason": "busy"}).encode()
                self._reply(h, 503, body, "application/json", {"Retry-After": "1"})
            else:
                self._reply(h, 200, b'{"status": "ready"}', "application/json")
        elif path == "/v1/models":
            model = {"id": "stand-in", "object": "model", "path": None}
            body = json.dumps({"object": "list", "data": [model]}).encode()
            self._reply(h, 200, body, "application/json")
        else:
            name = "index.html" if path == "/" else path.removeprefix("/static/")
            file = STATIC / name
            if "/" in name or not file.is_file():
                self._reply(h, 404, b"not found", "text/plain")
                return
            self._reply(h, 200, file.read_bytes(), self.TYPES.get(file.suffix, "text/plain"))

    @staticmethod
    def _reply(
        h: BaseHTTPRequestHandler,
        status: int,
        body: bytes,
        ctype: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Connection", "close")
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.end_headers()
        h.wfile.write(body)


@pytest.mark.browser
def test_browser_full_server_refusing_the_upgrade(browser: _Browser, tmp_path: Path) -> None:
    """An HTTP 503 before the upgrade reaches the page as a failed WebSocket: the page
    asks /ready, says the server is full, and on Try again waits as /ready's
    Retry-After says until a conversation is free, then connects."""
    artifacts = _artifacts(tmp_path)
    with _FullFront(busy_readies=2) as front:
        page = browser.new_page()
        page.set_viewport_size({"width": 1100, "height": 700})
        page.goto(front.url + "/")
        page.click("#start")
        page.wait_for_selector('#notice[data-kind="busy"]', timeout=15_000)
        _wait_state(page, "busy", 5_000)
        assert front.upgrades == 1 and front.readies == 1
        assert "The server is full." in page.text_content("#notice-title")
        assert "in use" in page.text_content("#notice-text")  # /ready's reason
        assert "come back in 1 s" in page.text_content("#notice-text")
        assert page.is_visible("#retry")
        assert "/ready: 503 busy" in page.text_content("#errors")
        page.screenshot(path=str(artifacts / "browser-full-503.png"), full_page=True)

        # The conversation is free by the time /ready says so: from then on the
        # WebSocket goes to a stand-in server that takes it.
        server = _FiguresServer()
        page.route_web_socket(REALTIME_SOCKET, server.route)
        page.click("#retry")
        page.wait_for_selector('#notice[data-kind="waiting"]', timeout=10_000)
        assert "Retry-After" in page.text_content("#notice-text")
        assert _stats(page)["retryAfterS"] == "1"
        _wait_state(page, "live", 20_000)
        assert front.readies == 3 and front.upgrades == 1
        assert page.is_hidden("#notice")
        _wait_stat(page, "audioDeltas", 2, 15_000)
        _cut(page)
    assert browser.page_errors == []
