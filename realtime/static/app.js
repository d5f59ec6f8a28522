// The browser client for /v1/realtime: mic -> 80 ms PCM16 appends, answer audio ->
// speakers through an adaptive jitter buffer; conversation, function channel, live
// figures, event log and downloads. No external resources, no build step.

const FRAME_SAMPLES = 1280; // 80 ms at 16 kHz: one model step
const FRAME_MS = 80;
const INPUT_RATE = 16000;
const OUTPUT_RATE = 22050;
const OUTPUT_FRAME = 1764; // 80 ms at 22.05 kHz
const SUBPROTOCOL = "realtime";
const KEY_PREFIX = "realtime-key.";
const LOG_LIMIT = 300; // event log entries kept
const RECORD_LIMIT_FRAMES = 30 * 60 * 12.5; // 30 min kept for the download
const METER_FLOOR_DB = -60;

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("settings"),
  apiKey: $("api-key"),
  mic: $("mic"),
  micRefresh: $("mic-refresh"),
  echo: $("echo"),
  echoApplied: $("echo-applied"),
  prompt: $("system-prompt"),
  seed: $("seed"),
  preview: $("update-preview"),
  volume: $("volume"),
  volumeValue: $("volume-value"),
  start: $("start"),
  stop: $("stop"),
  state: $("state"),
  model: $("model"),
  demo: $("demo-banner"),
  demoName: $("demo-name"),
  notice: $("notice"),
  stats: $("stats"),
  conversation: $("conversation"),
  conversationEmpty: $("conversation-empty"),
  user: $("user-transcript"),
  assistant: $("assistant-text"),
  fn: $("function-text"),
  errors: $("errors"),
  log: $("log"),
  logCount: $("log-count"),
  downloads: $("downloads"),
  wave: $("wave"),
};

const stats = {};
function resetStats() {
  Object.assign(stats, {
    appendsSent: 0,
    audioDeltas: 0,
    transcriptDeltas: 0,
    textDeltas: 0,
    functionDeltas: 0,
    lastFrameIndex: -1,
    bufferedMs: 0,
    latencyMs: 0,
    targetMs: 0,
    underruns: 0,
    droppedMs: 0,
    errors: 0,
    inputLevelDb: -120,
    outputLevelDb: -120,
    rttMs: -1,
    rttMedianMs: -1,
    rtf: 0,
  });
}
resetStats();

let call = null; // the one live call: {ws, ctx, stream, capture, playback, ...}
let served = null; // {id, demo} from GET /v1/models

// ---------------------------------------------------------------- state, notices

const ACTIVE = ["connecting", "configuring", "live", "committing"];

function setState(state, label) {
  ui.state.dataset.state = state;
  ui.state.textContent = label || state;
  document.body.dataset.state = state;
  const active = ACTIVE.includes(state);
  ui.start.disabled = active;
  ui.stop.disabled = !active;
  for (const el of [ui.apiKey, ui.mic, ui.echo, ui.prompt, ui.seed]) el.disabled = active;
  renderStats(); // figures and state change together for anyone watching both
}

function notice(kind, title, text) {
  if (!kind) {
    ui.notice.hidden = true;
    delete ui.notice.dataset.kind;
    return;
  }
  ui.notice.dataset.kind = kind;
  $("notice-title").textContent = title;
  $("notice-text").textContent = text || "";
  ui.notice.hidden = false;
}

function showError(message) {
  stats.errors += 1;
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${message}`;
  ui.errors.appendChild(li);
  scheduleRender();
}

// ---------------------------------------------------------------- figures

let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  const render = () => {
    renderQueued = false;
    renderStats();
  };
  // Once per frame; a hidden tab gets no animation frames, so a timer there.
  if (document.hidden) setTimeout(render, 100);
  else requestAnimationFrame(render);
}

const fmtMs = (ms) => `${Math.round(ms)} ms`;

function renderStats() {
  for (const [key, value] of Object.entries(stats)) {
    ui.stats.dataset[key] = String(key === "rtf" ? Math.round(value * 100) / 100 : Math.round(value));
  }
  $("stat-frames").textContent = `${stats.appendsSent} / ${stats.audioDeltas}`;
  $("stat-rtt").textContent =
    stats.rttMs < 0 ? "–" : `${fmtMs(stats.rttMs)} (median ${fmtMs(stats.rttMedianMs)})`;
  $("stat-latency").textContent = stats.targetMs
    ? `${fmtMs(stats.latencyMs)} (${fmtMs(stats.targetMs)})`
    : "–";
  $("stat-rtf").textContent = stats.rtf ? `${stats.rtf.toFixed(2)}×` : "–";
  $("stat-glitches").textContent = `${stats.underruns} / ${fmtMs(stats.droppedMs)}`;
  setMeter("in", stats.inputLevelDb, stats.appendsSent > 0);
  setMeter("out", stats.outputLevelDb, stats.audioDeltas > 0);
}

function setMeter(which, db, active) {
  const meter = $(`meter-${which}`);
  const value = Math.max(METER_FLOOR_DB, Math.min(0, Math.round(db)));
  meter.setAttribute("aria-valuenow", String(value));
  meter.setAttribute("aria-valuetext", active ? `${value} dBFS` : "silent");
  const fill = (100 * (value - METER_FLOOR_DB)) / -METER_FLOOR_DB;
  meter.firstElementChild.style.width = `${fill}%`;
  meter.dataset.hot = String(value > -6);
  $(`meter-${which}-db`).textContent = active ? `${value} dB` : "–";
}

function median(values) {
  if (!values.length) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[sorted.length >> 1];
}

// ---------------------------------------------------------------- model, key

function authHeaders() {
  const key = ui.apiKey.value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// GET /v1/models: {status, entry} or status 0 when the server cannot be reached.
async function probeModels() {
  try {
    const response = await fetch("/v1/models", { headers: authHeaders(), cache: "no-store" });
    if (!response.ok) return { status: response.status, entry: null };
    const body = await response.json();
    return { status: 200, entry: (body.data && body.data[0]) || null };
  } catch {
    return { status: 0, entry: null };
  }
}

async function loadModel() {
  const { status, entry } = await probeModels();
  if (status === 200 && entry) {
    const demo = entry.demo === true || String(entry.id).startsWith("realtime-demo");
    served = { id: entry.id, demo };
    ui.model.textContent = entry.id;
    ui.model.dataset.modelId = entry.id;
    ui.model.title = entry.path ? `${entry.id} (${entry.path})` : entry.id;
    ui.demoName.textContent = entry.id;
    ui.demo.hidden = !demo;
    if (["key", "unauthorized", "gone"].includes(ui.notice.dataset.kind)) notice(null);
  } else if (status === 401) {
    ui.model.textContent = "model: API key needed";
    ui.model.dataset.modelId = "";
    const typed = ui.apiKey.value.trim() !== "";
    notice(
      "key",
      typed ? "Wrong API key." : "This server needs an API key.",
      typed
        ? "The server refused it (HTTP 401). Check the key it was started with (--api-key)."
        : "Enter the key the server was started with (--api-key) above.",
    );
  } else if (status === 0) {
    ui.model.textContent = "model: server unreachable";
    notice("gone", "The server cannot be reached.", "Is `realtime serve` still running?");
  } else {
    ui.model.textContent = `model: HTTP ${status}`;
  }
  return status;
}

// ---------------------------------------------------------------- microphones

async function listMics() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  const mics = devices.filter((d) => d.kind === "audioinput" && d.deviceId !== "default");
  const chosen = ui.mic.value;
  ui.mic.textContent = "";
  ui.mic.append(new Option("System default", ""));
  mics.forEach((d, i) => ui.mic.append(new Option(d.label || `Microphone ${i + 1}`, d.deviceId)));
  ui.mic.value = [...ui.mic.options].some((o) => o.value === chosen) ? chosen : "";
}

// ---------------------------------------------------------------- wire helpers

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

function base64ToInt16(data) {
  const binary = atob(data);
  const bytes = new Uint8Array(binary.length & ~1);
  for (let i = 0; i < bytes.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Int16Array(bytes.buffer); // little-endian, as every browser platform is
}

function sessionUpdate() {
  const session = {};
  const prompt = ui.prompt.value.trim();
  if (prompt) session.system_prompt = prompt;
  const seed = Number.parseInt(ui.seed.value || "0", 10);
  session.seed = Number.isFinite(seed) && seed >= 0 ? seed : 0;
  return { type: "session.update", session };
}

function showPreview() {
  ui.preview.textContent = JSON.stringify(sessionUpdate());
}

function send(message) {
  if (call && call.ws.readyState === WebSocket.OPEN) {
    call.ws.send(JSON.stringify(message));
    if (message.type === "input_audio_buffer.append") logAppend();
    else log("→", message.type, summarize(message));
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- event log

const logState = { count: 0, append: null, audio: null };

function logEntry(text) {
  const li = document.createElement("li");
  li.textContent = text;
  ui.log.appendChild(li);
  while (ui.log.childElementCount > LOG_LIMIT) ui.log.firstElementChild.remove();
  logState.count += 1;
  ui.logCount.textContent = `(${logState.count})`;
  return li;
}

function stamp() {
  return call && call.t0 ? `${((performance.now() - call.t0) / 1000).toFixed(2)}s` : "0.00s";
}

function log(dir, type, detail) {
  logState.append = null;
  logState.audio = null;
  logEntry(`${stamp()} ${dir} ${type}${detail ? " " + detail : ""}`);
}

function logAppend() {
  const a = logState.append;
  if (a) {
    a.n += 1;
    a.li.textContent = `${a.t} → input_audio_buffer.append ×${a.n} (80 ms PCM16 each)`;
  } else {
    const t = stamp();
    logState.append = { t, n: 1, li: logEntry(`${t} → input_audio_buffer.append ×1 (80 ms PCM16 each)`) };
  }
}

function logAudio(index) {
  const a = logState.audio;
  if (a) {
    a.n += 1;
    a.li.textContent = `${a.t} ← response.audio.delta ×${a.n} (frames ${a.first}–${index})`;
  } else {
    const t = stamp();
    logState.audio = { t, n: 1, first: index, li: logEntry(`${t} ← response.audio.delta ×1 (frames ${index}–${index})`) };
  }
}

function summarize(event) {
  const { type, event_id: _id, ...rest } = event;
  const text = JSON.stringify(rest);
  return text.length > 400 ? text.slice(0, 400) + "…" : text;
}

// ---------------------------------------------------------------- conversation

function addToTurn(role, delta, frameIndex) {
  if (!delta) return;
  const turns = call.turns;
  let turn = turns[turns.length - 1];
  if (!turn || turn.role !== role) {
    turn = { role, frame: frameIndex, text: "" };
    turns.push(turn);
    const li = document.createElement("li");
    li.className = `turn ${role}`;
    const head = document.createElement("span");
    head.className = "who";
    const at = frameIndex >= 0 ? ` · ${((frameIndex * FRAME_MS) / 1000).toFixed(1)} s` : "";
    head.textContent = (role === "user" ? "You" : "Assistant") + at;
    const body = document.createElement("p");
    li.append(head, body);
    ui.conversation.appendChild(li);
    ui.conversationEmpty.hidden = true;
    turn.el = body;
  }
  turn.text += delta;
  turn.el.textContent = turn.text.trimStart();
  ui.conversation.scrollTop = ui.conversation.scrollHeight;
}

// The function channel: pretty-printed JSON when it parses (whole or line by line).
function formatFunction(text) {
  const trimmed = text.trim();
  if (!trimmed) return "";
  try {
    return JSON.stringify(JSON.parse(trimmed), null, 2);
  } catch {
    return trimmed
      .split("\n")
      .map((line) => {
        try {
          return JSON.stringify(JSON.parse(line), null, 2);
        } catch {
          return line;
        }
      })
      .join("\n");
  }
}

// ---------------------------------------------------------------- capture, playback

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
    const index = stats.appendsSent;
    const ok = send({
      type: "input_audio_buffer.append",
      audio: bytesToBase64(e.data.pcm),
      sample_rate: INPUT_RATE,
    });
    if (ok) {
      const now = performance.now();
      call.sentAt[index] = now;
      if (!call.firstSent) call.firstSent = now;
      if (call.mic.length < RECORD_LIMIT_FRAMES) call.mic.push(new Int16Array(e.data.pcm));
      stats.appendsSent += 1;
      stats.inputLevelDb = Math.max(-120, e.data.levelDb);
      scheduleRender();
    }
  };
  call.source.connect(call.capture);
  call.source.connect(call.micAnalyser);
  // The capture node outputs silence; connecting it keeps it pulled by the graph.
  call.capture.connect(ctx.destination);
}

function stopCapture(c = call) {
  if (!c) return;
  if (c.capture) {
    c.capture.port.postMessage({ type: "stop" });
    c.capture.disconnect();
    c.capture = null;
  }
  if (c.source) {
    c.source.disconnect();
    c.source = null;
  }
  if (c.stream) {
    for (const track of c.stream.getTracks()) track.stop();
  }
}

function onPlaybackStats(msg) {
  stats.bufferedMs = msg.bufferedMs;
  stats.latencyMs = msg.latencyMs;
  stats.targetMs = msg.targetMs;
  stats.underruns = msg.underruns;
  stats.droppedMs = msg.droppedMs;
  if (stats.audioDeltas > 0) stats.outputLevelDb = Math.max(-120, msg.levelDb);
  scheduleRender();
}

function onAudio(event) {
  const now = performance.now();
  stats.audioDeltas += 1;
  const index = event.frame_index;
  if (index <= stats.lastFrameIndex) showError(`audio frame_index went backwards (${index})`);
  stats.lastFrameIndex = index;
  logAudio(index);
  const sent = call.sentAt[index];
  if (sent !== undefined) {
    stats.rttMs = now - sent;
    call.rtts.push(stats.rttMs);
    if (call.rtts.length > 50) call.rtts.shift();
    stats.rttMedianMs = median(call.rtts);
  }
  // Real-time factor: audio received over the last 5 s of wall time.
  call.arrivals.push(now);
  while (call.arrivals.length && call.arrivals[0] < now - 5000) call.arrivals.shift();
  const span = Math.min(5000, now - call.firstSent);
  if (span >= 1000) stats.rtf = (call.arrivals.length * FRAME_MS) / span;
  const pcm = base64ToInt16(event.delta);
  if (index < RECORD_LIMIT_FRAMES) call.model[index] = pcm;
  const samples = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  call.playback.port.postMessage({ type: "audio", samples }, [samples.buffer]);
}

// ---------------------------------------------------------------- events

function onEvent(event) {
  if (event.type !== "response.audio.delta") log("←", event.type, summarize(event));
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
      call.t0 = call.t0 || performance.now();
      setState("live", "live: speak now");
      startCapture();
      break;
    case "conversation.item.input_audio_transcription.delta": {
      stats.transcriptDeltas += 1;
      const before = call.user;
      call.user = event.transcript != null ? event.transcript : call.user + (event.delta || "");
      const delta = event.delta != null ? event.delta : call.user.slice(before.length);
      ui.user.textContent = call.user;
      addToTurn("user", delta, event.frame_index);
      break;
    }
    case "response.text.delta": {
      stats.textDeltas += 1;
      const before = call.assistant;
      call.assistant = event.text != null ? event.text : call.assistant + (event.delta || "");
      const delta = event.delta != null ? event.delta : call.assistant.slice(before.length);
      ui.assistant.textContent = call.assistant;
      addToTurn("assistant", delta, event.frame_index);
      break;
    }
    case "response.function.delta":
      stats.functionDeltas += 1;
      call.fn = event.text != null ? event.text : call.fn + (event.delta || "");
      ui.fn.textContent = formatFunction(call.fn);
      break;
    case "response.audio.delta":
      onAudio(event);
      break;
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
        notice("busy", "The server is busy.", "Another session is active; try again when it ends.");
      }
      showError(`${err.code || "error"}: ${err.message || ""}`);
      break;
    }
    default:
      break;
  }
  scheduleRender();
}

async function onClose(event) {
  if (!call) return;
  const closing = call;
  call = null;
  stopCapture(closing);
  stats.inputLevelDb = -120; // the microphone is off now
  log("×", "close", `code ${event.code}${event.reason ? " " + event.reason : ""}`);
  ui.stats.dataset.closeCode = String(event.code);
  // Let queued speech finish, then release the audio device.
  const ctx = closing.ctx;
  setTimeout(() => ctx.close().catch(() => {}), Math.max(0, stats.bufferedMs) + 500);
  if (closing.mic.length || closing.model.length) offerDownloads(closing);

  if (event.code === 1013 || closing.busy) {
    setState("busy", "busy: another session is active");
    notice("busy", "The server is busy.", "Another session is active; try again when it ends.");
    if (!closing.busy) showError("server busy (1013): another session is active, try again later");
  } else if (event.code === 1006 && closing.state === "connecting") {
    // Browsers hide the HTTP status of a refused upgrade: ask /v1/models why.
    setState("connecting", "checking why…");
    const status = await probeModels();
    if (status.status === 401) {
      setState("unauthorized", "wrong API key");
      notice("unauthorized", "Wrong or missing API key.", "The server refused the key (HTTP 401). Enter the key it was started with (--api-key).");
      showError("could not connect: missing or wrong API key (HTTP 401)");
    } else if (status.status === 0) {
      setState("gone", "server unreachable");
      notice("gone", "The server cannot be reached.", "Is `realtime serve` still running?");
      showError("could not connect: the server is unreachable");
    } else {
      setState("error", "refused");
      notice("error", "The server refused the WebSocket.", "The key is fine, so the page's Origin is probably not allowed: start the server with --allowed-origin.");
      showError("could not connect: the server refused the WebSocket upgrade (Origin not allowed?)");
    }
  } else if (event.code === 1006) {
    const status = await probeModels();
    const gone = status.status === 0;
    setState(gone ? "gone" : "error", gone ? "server gone" : "connection lost");
    notice(gone ? "gone" : "error", gone ? "The server went away." : "The connection was lost.",
      gone ? "The session ended when the server stopped." : "The network dropped the connection.");
    showError(`connection lost (code 1006)${gone ? ": the server is gone" : ""}`);
  } else if (closing.state === "done" && event.code === 1000) {
    setState("closed", "finished");
  } else if (event.code === 1000 || event.code === 1005) {
    setState("closed", "closed");
  } else {
    const why = event.reason ? `: ${event.reason}` : "";
    showError(`connection closed (code ${event.code})${why}`);
    setState("error", `closed (${event.code})`);
  }
  scheduleRender();
}

// ---------------------------------------------------------------- downloads

// Stereo PCM16 WAV at 22.05 kHz: left = microphone (16 kHz, linearly resampled),
// right = model, both on the model's frame timeline (frame k at k × 80 ms).
function conversationWav(c) {
  const frames = Math.max(c.mic.length, c.model.length);
  const n = frames * OUTPUT_FRAME;
  const mic = new Float32Array(c.mic.length * FRAME_SAMPLES);
  c.mic.forEach((f, k) => {
    for (let i = 0; i < f.length; i++) mic[k * FRAME_SAMPLES + i] = f[i];
  });
  const bytes = new ArrayBuffer(44 + n * 4);
  const view = new DataView(bytes);
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + n * 4, true);
  text(8, "WAVE");
  text(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 2, true); // channels
  view.setUint32(24, OUTPUT_RATE, true);
  view.setUint32(28, OUTPUT_RATE * 4, true);
  view.setUint16(32, 4, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, n * 4, true);
  const step = INPUT_RATE / OUTPUT_RATE;
  for (let j = 0; j < n; j++) {
    const p = j * step;
    const i = Math.floor(p);
    const a = i < mic.length ? mic[i] : 0;
    const b = i + 1 < mic.length ? mic[i + 1] : 0;
    view.setInt16(44 + j * 4, Math.round(a + (b - a) * (p - i)), true);
    const frame = c.model[Math.floor(j / OUTPUT_FRAME)];
    view.setInt16(46 + j * 4, frame ? frame[j % OUTPUT_FRAME] || 0 : 0, true);
  }
  return new Blob([bytes], { type: "audio/wav" });
}

function conversationRecord(c) {
  return {
    model: served ? served.id : null,
    session_id: c.sessionId || null,
    started: c.started,
    frame_ms: FRAME_MS,
    turns: c.turns.map((t) => ({
      role: t.role,
      start_s: t.frame >= 0 ? (t.frame * FRAME_MS) / 1000 : null,
      text: t.text.trim(),
    })),
    function_channel: c.fn,
    figures: { ...stats },
  };
}

function conversationMarkdown(c) {
  const lines = [`# Conversation with ${served ? served.id : "the model"}`, ""];
  lines.push(`Session \`${c.sessionId || "?"}\`, started ${c.started}.`, "");
  for (const t of c.turns) {
    const at = t.frame >= 0 ? ` (${((t.frame * FRAME_MS) / 1000).toFixed(1)} s)` : "";
    lines.push(`**${t.role === "user" ? "You" : "Assistant"}**${at}: ${t.text.trim()}`, "");
  }
  if (c.fn.trim()) lines.push("## Function channel", "", "```", formatFunction(c.fn), "```", "");
  return lines.join("\n");
}

function offerDownloads(c) {
  clearDownloads();
  const stampName = c.started.replace(/[:.]/g, "-");
  const links = [
    ["download-wav", conversationWav(c), `conversation-${stampName}.wav`],
    ["download-md", new Blob([conversationMarkdown(c)], { type: "text/markdown" }), `conversation-${stampName}.md`],
    ["download-json", new Blob([JSON.stringify(conversationRecord(c), null, 2)], { type: "application/json" }), `conversation-${stampName}.json`],
  ];
  for (const [id, blob, name] of links) {
    const a = $(id);
    a.href = URL.createObjectURL(blob);
    a.download = name;
  }
  ui.downloads.hidden = false;
}

function clearDownloads() {
  for (const id of ["download-wav", "download-md", "download-json"]) {
    const a = $(id);
    if (a.href) URL.revokeObjectURL(a.href);
    a.removeAttribute("href");
  }
  ui.downloads.hidden = true;
}

// ---------------------------------------------------------------- waveform

function drawWave() {
  const canvas = ui.wave;
  const g = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  g.clearRect(0, 0, w, h);
  const styles = getComputedStyle(document.documentElement);
  g.strokeStyle = styles.getPropertyValue("--line");
  g.beginPath();
  g.moveTo(0, h / 2);
  g.lineTo(w, h / 2);
  g.stroke();
  if (call && call.micAnalyser) {
    const traces = [
      [call.micAnalyser, styles.getPropertyValue("--accent")],
      [call.outAnalyser, styles.getPropertyValue("--model")],
    ];
    for (const [analyser, color] of traces) {
      const data = new Float32Array(analyser.fftSize);
      analyser.getFloatTimeDomainData(data);
      g.strokeStyle = color;
      g.lineWidth = 1.5;
      g.beginPath();
      for (let x = 0; x < w; x++) {
        const v = data[Math.floor((x / w) * data.length)];
        const y = h / 2 - Math.max(-1, Math.min(1, v * 2)) * (h / 2 - 2);
        if (x === 0) g.moveTo(x, y);
        else g.lineTo(x, y);
      }
      g.stroke();
    }
    requestAnimationFrame(drawWave);
  }
}

// ---------------------------------------------------------------- start, stop

function micProblem(err) {
  const name = err && err.name;
  if (name === "NotAllowedError" || name === "SecurityError") {
    setState("denied", "microphone blocked");
    notice("denied", "Microphone permission denied.", "Allow the microphone for this page (the icon in the address bar) and press Start again.");
  } else if (name === "NotFoundError" || name === "OverconstrainedError" || name === "NotReadableError") {
    setState("nomic", "no microphone");
    notice("nomic", "No usable microphone.",
      name === "NotReadableError"
        ? "The microphone is in use by another program or failed to start."
        : "Plug one in, or pick another in the Microphone list.");
  } else {
    return false;
  }
  showError(`microphone: ${name}: ${err.message || ""}`);
  return true;
}

async function start() {
  if (call) return;
  resetStats();
  ui.errors.textContent = "";
  ui.conversation.textContent = "";
  ui.conversationEmpty.hidden = false;
  for (const el of [ui.user, ui.assistant, ui.fn]) el.textContent = "";
  delete ui.stats.dataset.closeCode;
  $("stat-session").textContent = "–";
  notice(null);
  clearDownloads();
  renderStats();
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    setState("nomic", "no microphone");
    notice("nomic", "The microphone needs a secure page.", "Open it from localhost or over HTTPS.");
    return;
  }
  setState("connecting", "opening microphone…");

  let ctx = null;
  let stream = null;
  try {
    ctx = new AudioContext({ latencyHint: "interactive" });
    await ctx.audioWorklet.addModule("/static/audio-worklet.js");
    const echo = ui.echo.checked;
    try {
      stream = await navigator.mediaDevices.getUserMedia({
        audio: {
          deviceId: ui.mic.value ? { exact: ui.mic.value } : undefined,
          channelCount: 1,
          echoCancellation: echo,
          noiseSuppression: echo,
          autoGainControl: echo,
        },
      });
    } catch (err) {
      ctx.close().catch(() => {});
      if (!micProblem(err)) throw err;
      return;
    }
    const settings = stream.getAudioTracks()[0].getSettings();
    ui.echoApplied.textContent =
      settings.echoCancellation === undefined
        ? ""
        : `Browser reports: echo cancellation ${settings.echoCancellation ? "on" : "off"}.`;
    listMics().catch(() => {});

    const playback = new AudioWorkletNode(ctx, "playback-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { inputRate: OUTPUT_RATE },
    });
    playback.port.onmessage = (e) => {
      if (e.data.type === "stats") onPlaybackStats(e.data);
    };
    const gain = ctx.createGain();
    gain.gain.value = Number(ui.volume.value) / 100;
    const micAnalyser = new AnalyserNode(ctx, { fftSize: 2048 });
    const outAnalyser = new AnalyserNode(ctx, { fftSize: 2048 });
    playback.connect(gain).connect(ctx.destination);
    playback.connect(outAnalyser);
    if (ctx.state === "suspended") await ctx.resume();
    ui.stats.dataset.sampleRate = String(ctx.sampleRate);

    setState("connecting", "connecting…");
    let ws;
    try {
      ws = new WebSocket(realtimeUrl(), subprotocols(ui.apiKey.value.trim()));
    } catch (err) {
      throw new Error(`cannot open the WebSocket (is the API key a plain token?): ${err.message}`);
    }
    call = {
      ws, ctx, stream, playback, gain, micAnalyser, outAnalyser,
      state: "connecting", user: "", assistant: "", fn: "", turns: [],
      sentAt: [], rtts: [], arrivals: [], firstSent: 0, t0: performance.now(),
      mic: [], model: [], started: new Date().toISOString(),
    };
    logState.append = null;
    logState.audio = null;
    log("→", "connect", realtimeUrl());
    requestAnimationFrame(drawWave);
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
    } else if (stream) {
      for (const track of stream.getTracks()) track.stop();
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

// ---------------------------------------------------------------- wiring

ui.form.addEventListener("submit", (e) => {
  e.preventDefault();
  start();
});
ui.stop.addEventListener("click", stop);
let keyTimer = 0;
ui.apiKey.addEventListener("input", () => {
  clearTimeout(keyTimer);
  keyTimer = setTimeout(loadModel, 400);
});
ui.prompt.addEventListener("input", showPreview);
ui.seed.addEventListener("input", showPreview);
ui.volume.addEventListener("input", () => {
  ui.volumeValue.textContent = `${ui.volume.value} %`;
  if (call) call.gain.gain.setTargetAtTime(Number(ui.volume.value) / 100, call.ctx.currentTime, 0.02);
});
ui.micRefresh.addEventListener("click", () => listMics().catch(() => {}));
if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
  navigator.mediaDevices.addEventListener("devicechange", () => listMics().catch(() => {}));
}
window.addEventListener("beforeunload", () => {
  if (call) call.ws.close(1000, "page closed");
});
setState("idle", "idle");
showPreview();
renderStats();
listMics().catch(() => {});
loadModel();
