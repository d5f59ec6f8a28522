// The browser client for /v1/realtime: mic -> 80 ms PCM16 appends, answer audio ->
// speakers, transcript / text / function channel shown live. No external resources.

const FRAME_SAMPLES = 1280; // 80 ms at 16 kHz: one model step
const INPUT_RATE = 16000;
const OUTPUT_RATE = 22050;
const TEXT_LIMIT = 6000; // characters kept on screen per channel
const SUBPROTOCOL = "realtime";
const KEY_PREFIX = "realtime-key.";

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("settings"),
  apiKey: $("api-key"),
  prompt: $("system-prompt"),
  seed: $("seed"),
  start: $("start"),
  stop: $("stop"),
  state: $("state"),
  stats: $("stats"),
  user: $("user-transcript"),
  assistant: $("assistant-text"),
  fn: $("function-text"),
  errors: $("errors"),
};

const stats = {
  appendsSent: 0,
  audioDeltas: 0,
  transcriptDeltas: 0,
  textDeltas: 0,
  functionDeltas: 0,
  lastFrameIndex: -1,
  bufferedMs: 0,
  underruns: 0,
  droppedMs: 0,
  errors: 0,
  inputLevelDb: -120,
};

let call = null; // the one live call: {ws, ctx, stream, capture, playback, ...}

function setState(state, label) {
  ui.state.dataset.state = state;
  ui.state.textContent = label || state;
  document.body.dataset.state = state;
  const active = ["connecting", "configuring", "live", "committing"].includes(state);
  ui.start.disabled = active;
  ui.stop.disabled = !active;
}

function renderStats() {
  for (const [key, value] of Object.entries(stats)) {
    ui.stats.dataset[key] = String(typeof value === "number" ? Math.round(value) : value);
  }
  $("stat-appends").textContent = String(stats.appendsSent);
  $("stat-audio").textContent = String(stats.audioDeltas);
  $("stat-level").textContent = stats.appendsSent ? `${Math.round(stats.inputLevelDb)} dBFS` : "–";
  $("stat-buffer").textContent = `${Math.round(stats.bufferedMs)} ms`;
  $("stat-glitches").textContent = `${stats.underruns} / ${Math.round(stats.droppedMs)} ms`;
}

function showError(message) {
  stats.errors += 1;
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${message}`;
  ui.errors.appendChild(li);
  renderStats();
}

function showText(element, text) {
  element.textContent = text.length > TEXT_LIMIT ? "…" + text.slice(-TEXT_LIMIT) : text;
  element.scrollTop = element.scrollHeight;
}

function realtimeUrl() {
  const url = new URL("/v1/realtime", window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

// Browsers cannot set headers on a WebSocket, so the key travels as a second
// subprotocol; the server answers with plain "realtime" and never echoes it.
function subprotocols(key) {
  return key ? [SUBPROTOCOL, KEY_PREFIX + key] : [SUBPROTOCOL];
}

function bytesToBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

function base64ToFloat(data) {
  const binary = atob(data);
  const view = new DataView(new ArrayBuffer(binary.length));
  for (let i = 0; i < binary.length; i++) view.setUint8(i, binary.charCodeAt(i));
  const out = new Float32Array(binary.length >> 1);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(i * 2, true) / 32768;
  return out;
}

function send(message) {
  if (call && call.ws.readyState === WebSocket.OPEN) {
    call.ws.send(JSON.stringify(message));
    return true;
  }
  return false;
}

function sessionUpdate() {
  const session = {};
  const prompt = ui.prompt.value.trim();
  if (prompt) session.system_prompt = prompt;
  const seed = Number.parseInt(ui.seed.value || "0", 10);
  session.seed = Number.isFinite(seed) && seed >= 0 ? seed : 0;
  return { type: "session.update", session };
}

function startCapture() {
  const { ctx, stream } = call;
  call.source = ctx.createMediaStreamSource(stream);
  call.capture = new AudioWorkletNode(ctx, "capture-processor", {
    numberOfInputs: 1,
    numberOfOutputs: 1,
    outputChannelCount: [1],
    processorOptions: { targetRate: INPUT_RATE, frameSamples: FRAME_SAMPLES },
  });
  call.capture.port.onmessage = (e) => {
    if (e.data.type !== "frame" || !call || call.state !== "live") return;
    const ok = send({
      type: "input_audio_buffer.append",
      audio: bytesToBase64(e.data.pcm),
      sample_rate: INPUT_RATE,
    });
    if (ok) {
      stats.appendsSent += 1;
      stats.inputLevelDb = Math.max(-120, e.data.levelDb);
      renderStats();
    }
  };
  call.source.connect(call.capture);
  // The capture node outputs silence; connecting it keeps it pulled by the graph.
  call.capture.connect(ctx.destination);
}

function stopCapture() {
  if (!call) return;
  if (call.capture) {
    call.capture.port.postMessage({ type: "stop" });
    call.capture.disconnect();
    call.capture = null;
  }
  if (call.source) {
    call.source.disconnect();
    call.source = null;
  }
  if (call.stream) {
    for (const track of call.stream.getTracks()) track.stop();
  }
}

function onEvent(event) {
  switch (event.type) {
    case "session.created":
      call.state = "configuring";
      call.sessionId = event.session && event.session.id;
      $("stat-session").textContent = call.sessionId || "–";
      ui.stats.dataset.sessionId = call.sessionId || "";
      setState("configuring", "configuring");
      send(sessionUpdate());
      break;
    case "session.updated":
      call.state = "live";
      setState("live", "live: speak now");
      startCapture();
      break;
    case "conversation.item.input_audio_transcription.delta":
      stats.transcriptDeltas += 1;
      call.user = event.transcript != null ? event.transcript : call.user + event.delta;
      showText(ui.user, call.user);
      break;
    case "response.text.delta":
      stats.textDeltas += 1;
      call.assistant = event.text != null ? event.text : call.assistant + event.delta;
      showText(ui.assistant, call.assistant);
      break;
    case "response.function.delta":
      stats.functionDeltas += 1;
      call.fn = event.text != null ? event.text : call.fn + event.delta;
      showText(ui.fn, call.fn);
      break;
    case "response.audio.delta": {
      stats.audioDeltas += 1;
      if (event.frame_index <= stats.lastFrameIndex) {
        showError(`audio frame_index went backwards (${event.frame_index})`);
      }
      stats.lastFrameIndex = event.frame_index;
      const samples = base64ToFloat(event.delta);
      call.playback.port.postMessage({ type: "audio", samples }, [samples.buffer]);
      break;
    }
    case "input_audio_buffer.committed":
      setState("committing", "finishing the answer…");
      break;
    case "response.done":
      call.state = "done";
      call.playback.port.postMessage({ type: "finish" });
      setState("done", "done");
      break;
    case "response.cancelled":
      call.state = "done";
      setState("done", "cancelled");
      break;
    case "error": {
      const err = event.error || {};
      if (err.code === "server_busy") {
        call.busy = true;
        setState("busy", "busy: another session is active");
      }
      showError(`${err.code || "error"}: ${err.message || ""}`);
      break;
    }
    default:
      break;
  }
  renderStats();
}

function onClose(event) {
  if (!call) return;
  const closing = call;
  stopCapture();
  if (event.code === 1013 || closing.busy) {
    setState("busy", "busy: another session is active");
    if (!closing.busy) showError("server busy (1013): another session is active, try again later");
  } else if (closing.state === "connecting" && event.code === 1006) {
    // Browsers hide the HTTP status of a refused upgrade; 401 and 403 both land here.
    showError(
      "could not connect: the server refused the WebSocket (missing or wrong API key, " +
        "Origin not allowed) or is unreachable",
    );
    setState("error", "refused");
  } else if (closing.state === "done" && event.code === 1000) {
    setState("closed", "finished");
  } else if (event.code === 1000 || event.code === 1005) {
    setState("closed", "closed");
  } else {
    const why = event.reason ? `: ${event.reason}` : "";
    showError(`connection closed (code ${event.code})${why}`);
    setState("error", `closed (${event.code})`);
  }
  ui.stats.dataset.closeCode = String(event.code);
  // Let queued speech finish, then release the audio device.
  const ctx = closing.ctx;
  setTimeout(() => ctx.close().catch(() => {}), Math.max(0, stats.bufferedMs) + 500);
  call = null;
}

async function start() {
  if (call) return;
  for (const key of Object.keys(stats)) stats[key] = 0;
  stats.lastFrameIndex = -1;
  stats.inputLevelDb = -120;
  ui.errors.textContent = "";
  for (const el of [ui.user, ui.assistant, ui.fn]) el.textContent = "";
  delete ui.stats.dataset.closeCode;
  renderStats();
  setState("connecting", "opening microphone…");

  let ctx = null;
  try {
    ctx = new AudioContext({ latencyHint: "interactive" });
    await ctx.audioWorklet.addModule("/static/audio-worklet.js");
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
    });
    const playback = new AudioWorkletNode(ctx, "playback-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { inputRate: OUTPUT_RATE, prebufferMs: 120, capacityMs: 3000 },
    });
    playback.port.onmessage = (e) => {
      const msg = e.data;
      if (msg.type === "stats") {
        stats.bufferedMs = msg.bufferedMs;
        stats.underruns = msg.underruns;
        stats.droppedMs = msg.droppedMs;
        renderStats();
      } else if (msg.type === "overflow") {
        console.warn(`playback buffer full: dropped ${msg.droppedMs.toFixed(0)} ms of old audio`);
      }
    };
    playback.connect(ctx.destination);
    if (ctx.state === "suspended") await ctx.resume();
    ui.stats.dataset.sampleRate = String(ctx.sampleRate);

    setState("connecting", "connecting…");
    let ws;
    try {
      ws = new WebSocket(realtimeUrl(), subprotocols(ui.apiKey.value.trim()));
    } catch (err) {
      throw new Error(`cannot open the WebSocket (is the API key a plain token?): ${err.message}`);
    }
    call = { ws, ctx, stream, playback, state: "connecting", user: "", assistant: "", fn: "" };
    ws.onmessage = (e) => {
      if (!call || call.ws !== ws) return;
      let event;
      try {
        event = JSON.parse(e.data);
      } catch (err) {
        showError(`server sent invalid JSON: ${err.message}`);
        return;
      }
      onEvent(event);
    };
    ws.onerror = () => {}; // the details (close code) arrive with onclose
    ws.onclose = (e) => {
      if (call && call.ws === ws) onClose(e);
    };
  } catch (err) {
    showError(err && err.message ? err.message : String(err));
    setState("error", "could not start");
    if (call) {
      stopCapture();
      call = null;
    }
    if (ctx) ctx.close().catch(() => {});
  }
}

function stop() {
  if (!call) return;
  if (call.state === "live") {
    call.state = "committing";
    stopCapture();
    send({ type: "input_audio_buffer.commit", pad_partial: true });
    setState("committing", "finishing the answer…");
  } else if (call.state !== "done") {
    call.ws.close(1000, "stopped by the user");
  }
}

ui.form.addEventListener("submit", (e) => {
  e.preventDefault();
  start();
});
ui.stop.addEventListener("click", stop);
window.addEventListener("beforeunload", () => {
  if (call) call.ws.close(1000, "page closed");
});
setState("idle", "idle");
renderStats();
