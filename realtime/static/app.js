// The browser client for /v1/realtime: mic -> PCM16 frame appends, answer audio ->
// speakers through an adaptive jitter buffer; conversation, function channel, live
// figures, event log and downloads. No external resources, no build step.
//
// One App holds the page's state, split into small units that each keep their own:
// Figures (the live numbers and their rendering), StatusView (state, banner, errors),
// EventLog, Transcript, Downloads, Waveform, ServedModel, and per call a Call (the
// WebSocket session), its CallAudio (capture and playback nodes), Timing and
// Recording. The frame and the rates are the server's, from session.updated
// (sessionFormat); nothing before that message needs them.

const SUBPROTOCOL = "realtime";
const KEY_PREFIX = "realtime-key.";
const LOG_LIMIT = 300; // event log entries kept
const RECORD_LIMIT_MS = 30 * 60 * 1000; // 30 min kept for the download
const METER_FLOOR_DB = -60;
const RTT_KEPT = 50; // round trips in the median
const RTF_WINDOW_MS = 5000; // audio received over this much wall time
const ACTIVE = ["connecting", "configuring", "live", "committing"];

// VoiceChat's figures: only for a field a server's session.updated leaves out.
export const DEFAULT_FORMAT = Object.freeze({ frameSamples: 1280, inputRate: 16000, outputRate: 22050 });

const INITIAL_FIGURES = Object.freeze({
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

const $ = (id) => document.getElementById(id);

// ---------------------------------------------------------------- pure helpers

function positive(value, fallback) {
  return Number.isInteger(value) && value > 0 ? value : fallback;
}

// A session's audio figures from session.updated's `session`: samples per input
// frame, both rates, and samples per output frame (`output_frame_samples` when the
// server sends it, else the output rate over one input frame's duration).
export function sessionFormat(session) {
  const s = session || {};
  const inFormat = s.input_audio_format || {};
  const outFormat = s.output_audio_format || {};
  const frameSamples = positive(s.frame_samples, DEFAULT_FORMAT.frameSamples);
  const inputRate = positive(inFormat.sample_rate, DEFAULT_FORMAT.inputRate);
  const outputRate = positive(outFormat.sample_rate, DEFAULT_FORMAT.outputRate);
  const outputFrameSamples = positive(
    s.output_frame_samples,
    Math.round((outputRate * frameSamples) / inputRate),
  );
  const frameMs = (1000 * frameSamples) / inputRate;
  return Object.freeze({ frameSamples, inputRate, outputRate, outputFrameSamples, frameMs });
}

export function median(values) {
  if (!values.length) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[sorted.length >> 1];
}

const fmtMs = (ms) => `${Math.round(ms)} ms`;

// A server message as a sentence for the banner: capital first letter, final stop.
export function sentence(text) {
  const t = String(text || "").trim();
  if (!t) return "";
  const s = t[0].toUpperCase() + t.slice(1);
  return /[.!?]$/.test(s) ? s : `${s}.`;
}

export function bytesToBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

export function base64ToInt16(data) {
  const binary = atob(data);
  const bytes = new Uint8Array(binary.length & ~1);
  for (let i = 0; i < bytes.length; i++) bytes[i] = binary.charCodeAt(i);
  return new Int16Array(bytes.buffer); // little-endian, as every browser platform is
}

// The function channel: pretty-printed JSON when it parses (whole or line by line).
export function formatFunction(text) {
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

export function summarize(event) {
  const { type, event_id: _id, ...rest } = event;
  const text = JSON.stringify(rest);
  return text.length > 400 ? text.slice(0, 400) + "…" : text;
}

export function sessionUpdate(promptText, seedText) {
  const session = {};
  const prompt = promptText.trim();
  if (prompt) session.system_prompt = prompt;
  const seed = Number.parseInt(seedText || "0", 10);
  session.seed = Number.isFinite(seed) && seed >= 0 ? seed : 0;
  return { type: "session.update", session };
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

function authHeaders(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// GET /v1/models: {status, entry} or status 0 when the server cannot be reached.
async function probeModels(key) {
  try {
    const response = await fetch("/v1/models", { headers: authHeaders(key), cache: "no-store" });
    if (!response.ok) return { status: response.status, entry: null };
    const body = await response.json();
    return { status: 200, entry: (body.data && body.data[0]) || null };
  } catch {
    return { status: 0, entry: null };
  }
}

async function listMics(select) {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  const mics = devices.filter((d) => d.kind === "audioinput" && d.deviceId !== "default");
  const chosen = select.value;
  select.textContent = "";
  select.append(new Option("System default", ""));
  mics.forEach((d, i) => select.append(new Option(d.label || `Microphone ${i + 1}`, d.deviceId)));
  select.value = [...select.options].some((o) => o.value === chosen) ? chosen : "";
}

// ---------------------------------------------------------------- one call's figures

// Round trips (an append's send -> the audio frame with its frame_index) and the
// real-time factor (audio received over the last 5 s of wall time).
export class Timing {
  constructor(frameMs) {
    this.frameMs = frameMs;
    this.sentAt = [];
    this.rtts = [];
    this.arrivals = [];
    this.firstSent = 0;
  }

  sent(index, now) {
    this.sentAt[index] = now;
    if (!this.firstSent) this.firstSent = now;
  }

  // The figures frame `index` arriving at `now` updates: rttMs and rttMedianMs when
  // its append is known, rtf once a second has passed since the first append.
  answered(index, now) {
    const figures = {};
    const sent = this.sentAt[index];
    if (sent !== undefined) {
      figures.rttMs = now - sent;
      this.rtts.push(figures.rttMs);
      if (this.rtts.length > RTT_KEPT) this.rtts.shift();
      figures.rttMedianMs = median(this.rtts);
    }
    this.arrivals.push(now);
    while (this.arrivals.length && this.arrivals[0] < now - RTF_WINDOW_MS) this.arrivals.shift();
    const span = Math.min(RTF_WINDOW_MS, now - this.firstSent);
    if (span >= 1000) figures.rtf = (this.arrivals.length * this.frameMs) / span;
    return figures;
  }
}

// The audio kept for the download: microphone frames in order, model frames by
// frame_index, 30 minutes of each at most.
export class Recording {
  constructor(format) {
    this.format = format;
    this.limit = Math.floor(RECORD_LIMIT_MS / format.frameMs);
    this.mic = [];
    this.model = [];
  }

  get empty() {
    return this.mic.length === 0 && this.model.length === 0;
  }

  addMic(pcm) {
    if (this.mic.length < this.limit) this.mic.push(pcm);
  }

  addModel(index, pcm) {
    if (index < this.limit) this.model[index] = pcm;
  }

  wav() {
    return new Blob([conversationWav(this.mic, this.model, this.format)], { type: "audio/wav" });
  }
}

function writeWavHeader(view, frames, rate) {
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  text(0, "RIFF");
  view.setUint32(4, 36 + frames * 4, true);
  text(8, "WAVE");
  text(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 2, true); // channels
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 4, true);
  view.setUint16(32, 4, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, frames * 4, true);
}

// Stereo PCM16 WAV at the output rate: left = microphone (at the input rate, linearly
// resampled), right = model, both on the model's frame timeline (frame k at k frames).
export function conversationWav(mic, model, format) {
  const { frameSamples, outputFrameSamples: outFrame, inputRate, outputRate } = format;
  const n = Math.max(mic.length, model.length) * outFrame;
  const input = new Float32Array(mic.length * frameSamples);
  mic.forEach((f, k) => input.set(f, k * frameSamples));
  const bytes = new ArrayBuffer(44 + n * 4);
  const view = new DataView(bytes);
  writeWavHeader(view, n, outputRate);
  const step = inputRate / outputRate;
  for (let j = 0; j < n; j++) {
    const p = j * step;
    const i = Math.floor(p);
    const a = i < input.length ? input[i] : 0;
    const b = i + 1 < input.length ? input[i + 1] : 0;
    view.setInt16(44 + j * 4, Math.round(a + (b - a) * (p - i)), true);
    const frame = model[Math.floor(j / outFrame)];
    view.setInt16(46 + j * 4, frame ? frame[j % outFrame] || 0 : 0, true);
  }
  return bytes;
}

const turnStart = (t, frameMs) => (t.frame >= 0 ? (t.frame * frameMs) / 1000 : null);

// `c`: {model, sessionId, started, frameMs, turns, fn, figures} of a finished call.
export function conversationRecord(c) {
  return {
    model: c.model,
    session_id: c.sessionId || null,
    started: c.started,
    frame_ms: c.frameMs,
    turns: c.turns.map((t) => ({ role: t.role, start_s: turnStart(t, c.frameMs), text: t.text.trim() })),
    function_channel: c.fn,
    figures: { ...c.figures },
  };
}

export function conversationMarkdown(c) {
  const lines = [`# Conversation with ${c.model || "the model"}`, ""];
  lines.push(`Session \`${c.sessionId || "?"}\`, started ${c.started}.`, "");
  for (const t of c.turns) {
    const start = turnStart(t, c.frameMs);
    const at = start === null ? "" : ` (${start.toFixed(1)} s)`;
    lines.push(`**${t.role === "user" ? "You" : "Assistant"}**${at}: ${t.text.trim()}`, "");
  }
  if (c.fn.trim()) lines.push("## Function channel", "", "```", formatFunction(c.fn), "```", "");
  return lines.join("\n");
}

// ---------------------------------------------------------------- page units

// The live numbers (also mirrored as data-* on #stats for scripts and tests) and
// their rendering, at most once per animation frame.
class Figures {
  constructor(ui) {
    this.ui = ui;
    this.values = { ...INITIAL_FIGURES };
    this.queued = false;
  }

  reset() {
    Object.assign(this.values, INITIAL_FIGURES);
  }

  schedule() {
    if (this.queued) return;
    this.queued = true;
    const render = () => {
      this.queued = false;
      this.render();
    };
    // Once per frame; a hidden tab gets no animation frames, so a timer there.
    if (document.hidden) setTimeout(render, 100);
    else requestAnimationFrame(render);
  }

  // The playback worklet's report (about 20 a second).
  playback(msg) {
    const v = this.values;
    v.bufferedMs = msg.bufferedMs;
    v.latencyMs = msg.latencyMs;
    v.targetMs = msg.targetMs;
    v.underruns = msg.underruns;
    v.droppedMs = msg.droppedMs;
    if (v.audioDeltas > 0) v.outputLevelDb = Math.max(-120, msg.levelDb);
    this.schedule();
  }

  render() {
    const { ui, values: v } = this;
    for (const [key, value] of Object.entries(v)) {
      ui.stats.dataset[key] = String(key === "rtf" ? Math.round(value * 100) / 100 : Math.round(value));
    }
    ui.statFrames.textContent = `${v.appendsSent} / ${v.audioDeltas}`;
    ui.statRtt.textContent = v.rttMs < 0 ? "–" : `${fmtMs(v.rttMs)} (median ${fmtMs(v.rttMedianMs)})`;
    ui.statLatency.textContent = v.targetMs ? `${fmtMs(v.latencyMs)} (${fmtMs(v.targetMs)})` : "–";
    ui.statRtf.textContent = v.rtf ? `${v.rtf.toFixed(2)}×` : "–";
    ui.statGlitches.textContent = `${v.underruns} / ${fmtMs(v.droppedMs)}`;
    this.meter("in", v.inputLevelDb, v.appendsSent > 0);
    this.meter("out", v.outputLevelDb, v.audioDeltas > 0);
  }

  meter(which, db, active) {
    const meter = $(`meter-${which}`);
    const value = Math.max(METER_FLOOR_DB, Math.min(0, Math.round(db)));
    meter.setAttribute("aria-valuenow", String(value));
    meter.setAttribute("aria-valuetext", active ? `${value} dBFS` : "silent");
    const fill = (100 * (value - METER_FLOOR_DB)) / -METER_FLOOR_DB;
    meter.firstElementChild.style.width = `${fill}%`;
    meter.dataset.hot = String(value > -6);
    $(`meter-${which}-db`).textContent = active ? `${value} dB` : "–";
  }
}

// The state badge and the controls it enables, the banner, the error list.
class StatusView {
  constructor(ui, figures) {
    this.ui = ui;
    this.figures = figures;
  }

  get noticeKind() {
    return this.ui.notice.dataset.kind;
  }

  set(state, label) {
    const { ui } = this;
    ui.state.dataset.state = state;
    ui.state.textContent = label || state;
    document.body.dataset.state = state;
    const active = ACTIVE.includes(state);
    ui.start.disabled = active;
    ui.stop.disabled = !active;
    for (const el of [ui.apiKey, ui.mic, ui.echo, ui.prompt, ui.seed]) el.disabled = active;
    this.figures.render(); // figures and state change together for anyone watching both
  }

  notice(kind, title, text) {
    const { notice } = this.ui;
    if (!kind) {
      notice.hidden = true;
      delete notice.dataset.kind;
      return;
    }
    notice.dataset.kind = kind;
    this.ui.noticeTitle.textContent = title;
    this.ui.noticeText.textContent = text || "";
    notice.hidden = false;
  }

  // Refused for want of a free conversation (server_busy, close 1013). `message` is
  // the server's own: all of its conversations in use, or at its real-time capacity.
  busy(message) {
    this.set("busy", "busy: no free conversation");
    const why = sentence(message || "no conversation is free; try again later");
    this.notice("busy", "The server is busy.", why);
  }

  gone() {
    this.notice("gone", "The server cannot be reached.", "Is `realtime serve` still running?");
  }

  error(message) {
    this.figures.values.errors += 1;
    const li = document.createElement("li");
    li.textContent = `${new Date().toLocaleTimeString()} ${message}`;
    this.ui.errors.appendChild(li);
    this.figures.schedule();
  }

  clearErrors() {
    this.ui.errors.textContent = "";
  }
}

// The event log: the last LOG_LIMIT entries, runs of appends and of audio deltas
// counted in one line each, times from the call's start.
export class EventLog {
  constructor(list, counter, limit = LOG_LIMIT) {
    this.list = list;
    this.counter = counter;
    this.limit = limit;
    this.count = 0;
    this.appends = null;
    this.audio = null;
    this.t0 = 0;
  }

  startClock(t0) {
    this.t0 = t0;
  }

  stopClock() {
    this.t0 = 0;
  }

  stamp() {
    return this.t0 ? `${((performance.now() - this.t0) / 1000).toFixed(2)}s` : "0.00s";
  }

  entry(text) {
    const li = document.createElement("li");
    li.textContent = text;
    this.list.appendChild(li);
    while (this.list.childElementCount > this.limit) this.list.firstElementChild.remove();
    this.count += 1;
    this.counter.textContent = `(${this.count})`;
    return li;
  }

  event(dir, type, detail) {
    this.appends = null;
    this.audio = null;
    this.entry(`${this.stamp()} ${dir} ${type}${detail ? " " + detail : ""}`);
  }

  append(frameMs) {
    const text = (run) => `${run.t} → input_audio_buffer.append ×${run.n} (${Math.round(frameMs)} ms PCM16 each)`;
    this.appends = this.grow(this.appends, {}, text);
  }

  audioFrame(index) {
    const text = (run) => `${run.t} ← response.audio.delta ×${run.n} (frames ${run.first}–${index})`;
    this.audio = this.grow(this.audio, { first: index }, text);
  }

  // One more in `run` (or a new run with `fields`): its line rewritten in place.
  grow(run, fields, text) {
    if (run) {
      run.n += 1;
      run.li.textContent = text(run);
      return run;
    }
    const fresh = { t: this.stamp(), n: 1, ...fields };
    fresh.li = this.entry(text(fresh));
    return fresh;
  }
}

// The conversation: your transcript and the assistant's text in alternating turns,
// the whole texts so far, and the function channel.
class Transcript {
  constructor(ui) {
    this.ui = ui;
    this.views = { user: ui.user, assistant: ui.assistant };
    this.frameMs = 0; // the session's, once session.updated has come
    this.reset();
  }

  reset() {
    this.user = "";
    this.assistant = "";
    this.fn = "";
    this.turns = [];
    const { ui } = this;
    ui.conversation.textContent = "";
    ui.conversationEmpty.hidden = false;
    for (const el of [ui.user, ui.assistant, ui.fn]) el.textContent = "";
  }

  // A transcript or text delta: `whole` is the text so far when the server sends it.
  grow(role, event, whole) {
    const before = this[role];
    this[role] = whole != null ? whole : before + (event.delta || "");
    const delta = event.delta != null ? event.delta : this[role].slice(before.length);
    this.views[role].textContent = this[role];
    this.addToTurn(role, delta, event.frame_index);
  }

  functionDelta(event) {
    this.fn = event.text != null ? event.text : this.fn + (event.delta || "");
    this.ui.fn.textContent = formatFunction(this.fn);
  }

  addToTurn(role, delta, frameIndex) {
    if (!delta) return;
    let turn = this.turns[this.turns.length - 1];
    if (!turn || turn.role !== role) {
      turn = { role, frame: frameIndex, text: "", el: this.turnElement(role, frameIndex) };
      this.turns.push(turn);
    }
    turn.text += delta;
    turn.el.textContent = turn.text.trimStart();
    this.ui.conversation.scrollTop = this.ui.conversation.scrollHeight;
  }

  turnElement(role, frameIndex) {
    const li = document.createElement("li");
    li.className = `turn ${role}`;
    const head = document.createElement("span");
    head.className = "who";
    const known = frameIndex >= 0 && this.frameMs > 0;
    const at = known ? ` · ${((frameIndex * this.frameMs) / 1000).toFixed(1)} s` : "";
    head.textContent = (role === "user" ? "You" : "Assistant") + at;
    const body = document.createElement("p");
    li.append(head, body);
    this.ui.conversation.appendChild(li);
    this.ui.conversationEmpty.hidden = true;
    return body;
  }
}

// The three download links offered when a call with audio ends.
class Downloads {
  constructor(ui) {
    this.ui = ui;
    this.links = [ui.downloadWav, ui.downloadMd, ui.downloadJson];
  }

  clear() {
    for (const a of this.links) {
      if (a.href) URL.revokeObjectURL(a.href);
      a.removeAttribute("href");
    }
    this.ui.downloads.hidden = true;
  }

  offer(recording, conversation) {
    this.clear();
    const name = `conversation-${conversation.started.replace(/[:.]/g, "-")}`;
    const json = JSON.stringify(conversationRecord(conversation), null, 2);
    const blobs = [
      [recording.wav(), `${name}.wav`],
      [new Blob([conversationMarkdown(conversation)], { type: "text/markdown" }), `${name}.md`],
      [new Blob([json], { type: "application/json" }), `${name}.json`],
    ];
    blobs.forEach(([blob, file], i) => {
      this.links[i].href = URL.createObjectURL(blob);
      this.links[i].download = file;
    });
    this.ui.downloads.hidden = false;
  }
}

// The two-trace waveform, redrawn every animation frame while `traces()` gives
// analysers (while a call is on).
class Waveform {
  constructor(canvas) {
    this.canvas = canvas;
    this.traces = () => null;
  }

  start(traces) {
    this.traces = traces;
    requestAnimationFrame(() => this.draw());
  }

  draw() {
    const { canvas } = this;
    const g = canvas.getContext("2d");
    const { width: w, height: h } = canvas;
    g.clearRect(0, 0, w, h);
    const styles = getComputedStyle(document.documentElement);
    g.strokeStyle = styles.getPropertyValue("--line");
    g.beginPath();
    g.moveTo(0, h / 2);
    g.lineTo(w, h / 2);
    g.stroke();
    const analysers = this.traces();
    if (!analysers) return;
    const colors = [styles.getPropertyValue("--accent"), styles.getPropertyValue("--model")];
    analysers.forEach((analyser, k) => this.trace(g, analyser, colors[k]));
    requestAnimationFrame(() => this.draw());
  }

  trace(g, analyser, color) {
    const { width: w, height: h } = this.canvas;
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
}

// The served model (GET /v1/models) and what the page says about it.
class ServedModel {
  constructor(ui, status) {
    this.ui = ui;
    this.status = status;
    this.served = null; // {id, demo}
  }

  get id() {
    return this.served ? this.served.id : null;
  }

  async load() {
    const { ui } = this;
    const key = ui.apiKey.value.trim();
    const { status, entry } = await probeModels(key);
    if (status === 200 && entry) {
      this.show(entry);
    } else if (status === 401) {
      ui.model.textContent = "model: API key needed";
      ui.model.dataset.modelId = "";
      this.status.notice(
        "key",
        key ? "Wrong API key." : "This server needs an API key.",
        key
          ? "The server refused it (HTTP 401). Check the key it was started with (--api-key)."
          : "Enter the key the server was started with (--api-key) above.",
      );
    } else if (status === 0) {
      ui.model.textContent = "model: server unreachable";
      this.status.gone();
    } else {
      ui.model.textContent = `model: HTTP ${status}`;
    }
    return status;
  }

  show(entry) {
    const { ui } = this;
    const demo = entry.demo === true || String(entry.id).startsWith("realtime-demo");
    this.served = { id: entry.id, demo };
    ui.model.textContent = entry.id;
    ui.model.dataset.modelId = entry.id;
    ui.model.title = entry.path ? `${entry.id} (${entry.path})` : entry.id;
    ui.demoName.textContent = entry.id;
    ui.demo.hidden = !demo;
    if (["key", "unauthorized", "gone"].includes(this.status.noticeKind)) this.status.notice(null);
  }
}

// ---------------------------------------------------------------- one call

// getUserMedia refused: the page explains some of these (App.micProblem).
class MicError extends Error {
  constructor(cause) {
    super(cause && cause.message ? cause.message : String(cause));
    this.cause = cause;
  }
}

// One call's audio graph: microphone -> capture worklet (frames for the appends),
// playback worklet -> volume -> speakers, and an analyser on each side.
class CallAudio {
  static async open(deviceId, echo, volume) {
    const ctx = new AudioContext({ latencyHint: "interactive" });
    try {
      await ctx.audioWorklet.addModule("/static/audio-worklet.js");
      const stream = await navigator.mediaDevices
        .getUserMedia({
          audio: {
            deviceId: deviceId ? { exact: deviceId } : undefined,
            channelCount: 1,
            echoCancellation: echo,
            noiseSuppression: echo,
            autoGainControl: echo,
          },
        })
        .catch((err) => Promise.reject(new MicError(err)));
      return new CallAudio(ctx, stream, volume);
    } catch (err) {
      ctx.close().catch(() => {});
      throw err;
    }
  }

  constructor(ctx, stream, volume) {
    this.ctx = ctx;
    this.stream = stream;
    this.gain = ctx.createGain();
    this.gain.gain.value = volume;
    this.gain.connect(ctx.destination);
    this.micAnalyser = new AnalyserNode(ctx, { fftSize: 2048 });
    this.outAnalyser = new AnalyserNode(ctx, { fftSize: 2048 });
    this.source = null;
    this.capture = null;
    this.playback = null;
  }

  echoReport() {
    const settings = this.stream.getAudioTracks()[0].getSettings();
    if (settings.echoCancellation === undefined) return "";
    return `Browser reports: echo cancellation ${settings.echoCancellation ? "on" : "off"}.`;
  }

  async resume() {
    if (this.ctx.state === "suspended") await this.ctx.resume();
  }

  // Frames of `format.frameSamples` at `format.inputRate` to onFrame({pcm, levelDb}).
  startCapture(format, onFrame) {
    const { ctx } = this;
    this.source = ctx.createMediaStreamSource(this.stream);
    this.capture = new AudioWorkletNode(ctx, "capture-processor", {
      numberOfInputs: 1,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { targetRate: format.inputRate, frameSamples: format.frameSamples },
    });
    this.capture.port.onmessage = (e) => {
      if (e.data.type === "frame") onFrame(e.data);
    };
    this.source.connect(this.capture);
    this.source.connect(this.micAnalyser);
    // The capture node outputs silence; connecting it keeps it pulled by the graph.
    this.capture.connect(ctx.destination);
  }

  // The microphone off for good: the capture nodes and the tracks.
  stopCapture() {
    if (this.capture) {
      this.capture.port.postMessage({ type: "stop" });
      this.capture.disconnect();
      this.capture = null;
    }
    if (this.source) {
      this.source.disconnect();
      this.source = null;
    }
    for (const track of this.stream.getTracks()) track.stop();
  }

  // Answer audio arrives at `format.outputRate`; the worklet resamples it.
  openPlayback(format, onStats) {
    this.playback = new AudioWorkletNode(this.ctx, "playback-processor", {
      numberOfInputs: 0,
      numberOfOutputs: 1,
      outputChannelCount: [1],
      processorOptions: { inputRate: format.outputRate },
    });
    this.playback.port.onmessage = (e) => {
      if (e.data.type === "stats") onStats(e.data);
    };
    this.playback.connect(this.gain);
    this.playback.connect(this.outAnalyser);
  }

  play(pcm) {
    const samples = new Float32Array(pcm.length);
    for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
    this.playback.port.postMessage({ type: "audio", samples }, [samples.buffer]);
  }

  finish() {
    if (this.playback) this.playback.port.postMessage({ type: "finish" });
  }

  setVolume(volume) {
    this.gain.gain.setTargetAtTime(volume, this.ctx.currentTime, 0.02);
  }

  close(afterMs = 0) {
    const { ctx } = this;
    setTimeout(() => ctx.close().catch(() => {}), afterMs);
  }
}

// One WebSocket session: its phase, the server's figures once session.updated has
// come, and the handling of every server event.
class Call {
  constructor(app, audio, ws) {
    this.app = app;
    this.audio = audio;
    this.ws = ws;
    this.state = "connecting";
    this.sessionId = null;
    this.busy = false;
    this.busyMessage = ""; // the server's server_busy message
    this.format = null; // from session.updated
    this.timing = null;
    this.recording = null;
    this.started = new Date().toISOString();
    ws.onmessage = (e) => this.receive(e.data);
    ws.onerror = () => {}; // the details (close code) arrive with onclose
    ws.onclose = (e) => app.closed(this, e);
  }

  get current() {
    return this.app.call === this;
  }

  send(message) {
    if (this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    if (message.type === "input_audio_buffer.append") this.app.log.append(this.format.frameMs);
    else this.app.log.event("→", message.type, summarize(message));
    return true;
  }

  receive(data) {
    if (!this.current) return;
    let event;
    try {
      event = JSON.parse(data);
    } catch (err) {
      this.app.status.error(`server sent invalid JSON: ${err.message}`);
      return;
    }
    this.dispatch(event);
  }

  dispatch(event) {
    const { figures, transcript, status, log } = this.app;
    if (event.type !== "response.audio.delta") log.event("←", event.type, summarize(event));
    switch (event.type) {
      case "session.created":
        this.created(event.session || {});
        break;
      case "session.updated":
        this.updated(event.session || {});
        break;
      case "conversation.item.input_audio_transcription.delta":
        figures.values.transcriptDeltas += 1;
        transcript.grow("user", event, event.transcript);
        break;
      case "response.text.delta":
        figures.values.textDeltas += 1;
        transcript.grow("assistant", event, event.text);
        break;
      case "response.function.delta":
        figures.values.functionDeltas += 1;
        transcript.functionDelta(event);
        break;
      case "response.audio.delta":
        this.audioDelta(event);
        break;
      case "input_audio_buffer.committed":
        status.set("committing", "finishing the answer…");
        break;
      case "response.done":
        this.state = "done";
        this.audio.finish();
        status.set("done", "done");
        break;
      case "response.cancelled":
        this.state = "done";
        status.set("done", "cancelled");
        break;
      case "error":
        this.serverError(event.error || {});
        break;
      default:
        break;
    }
    figures.schedule();
  }

  created(session) {
    const { ui, status } = this.app;
    this.state = "configuring";
    this.sessionId = session.id;
    ui.statSession.textContent = this.sessionId || "–";
    ui.stats.dataset.sessionId = this.sessionId || "";
    status.set("configuring", "configuring");
    this.send(sessionUpdate(ui.prompt.value, ui.seed.value));
  }

  // The session is ready, with its frame and rates: audio can flow both ways.
  updated(session) {
    const { app, audio } = this;
    this.format = sessionFormat(session);
    this.timing = new Timing(this.format.frameMs);
    this.recording = new Recording(this.format);
    app.transcript.frameMs = this.format.frameMs;
    audio.openPlayback(this.format, (msg) => app.figures.playback(msg));
    this.state = "live";
    app.status.set("live", "live: speak now");
    audio.startCapture(this.format, (frame) => this.captured(frame));
  }

  captured(frame) {
    if (!this.current || this.state !== "live") return;
    const { figures } = this.app;
    const index = figures.values.appendsSent;
    const sent = this.send({
      type: "input_audio_buffer.append",
      audio: bytesToBase64(frame.pcm),
      sample_rate: this.format.inputRate,
    });
    if (!sent) return;
    this.timing.sent(index, performance.now());
    this.recording.addMic(new Int16Array(frame.pcm));
    figures.values.appendsSent += 1;
    figures.values.inputLevelDb = Math.max(-120, frame.levelDb);
    figures.schedule();
  }

  audioDelta(event) {
    const { figures, status, log } = this.app;
    if (!this.format) {
      status.error("response.audio.delta before session.updated");
      return;
    }
    const now = performance.now();
    const values = figures.values;
    values.audioDeltas += 1;
    const index = event.frame_index;
    if (index <= values.lastFrameIndex) status.error(`audio frame_index went backwards (${index})`);
    values.lastFrameIndex = index;
    log.audioFrame(index);
    Object.assign(values, this.timing.answered(index, now));
    const pcm = base64ToInt16(event.delta);
    this.recording.addModel(index, pcm);
    this.audio.play(pcm);
  }

  serverError(err) {
    if (err.code === "server_busy") {
      this.busy = true;
      this.busyMessage = err.message || "";
      this.app.status.busy(this.busyMessage);
    }
    this.app.status.error(`${err.code || "error"}: ${err.message || ""}`);
  }

  // Stop: a live call commits (the answer ends with what was said so far); one
  // still setting up is closed.
  stop() {
    if (this.state === "live") {
      this.state = "committing";
      this.audio.stopCapture();
      this.send({ type: "input_audio_buffer.commit", pad_partial: true });
      this.app.status.set("committing", "finishing the answer…");
    } else if (this.state !== "done") {
      this.ws.close(1000, "stopped by the user");
    }
  }

  // What the downloads say about this call.
  conversation() {
    const { transcript, figures, model } = this.app;
    return {
      model: model.id,
      sessionId: this.sessionId,
      started: this.started,
      frameMs: this.format.frameMs,
      turns: transcript.turns,
      fn: transcript.fn,
      figures: figures.values,
    };
  }
}

// ---------------------------------------------------------------- the app

function findElements() {
  const ids = {
    form: "settings", apiKey: "api-key", mic: "mic", micRefresh: "mic-refresh",
    echo: "echo", echoApplied: "echo-applied", prompt: "system-prompt", seed: "seed",
    preview: "update-preview", volume: "volume", volumeValue: "volume-value",
    start: "start", stop: "stop", state: "state", model: "model", demo: "demo-banner",
    demoName: "demo-name", notice: "notice", noticeTitle: "notice-title",
    noticeText: "notice-text", stats: "stats", statFrames: "stat-frames",
    statRtt: "stat-rtt", statLatency: "stat-latency", statRtf: "stat-rtf",
    statGlitches: "stat-glitches", statSession: "stat-session",
    conversation: "conversation", conversationEmpty: "conversation-empty",
    user: "user-transcript", assistant: "assistant-text", fn: "function-text",
    errors: "errors", log: "log", logCount: "log-count", downloads: "downloads",
    downloadWav: "download-wav", downloadMd: "download-md", downloadJson: "download-json",
    wave: "wave",
  };
  return Object.freeze(Object.fromEntries(Object.entries(ids).map(([k, id]) => [k, $(id)])));
}

class App {
  constructor(ui) {
    this.ui = ui;
    this.figures = new Figures(ui);
    this.status = new StatusView(ui, this.figures);
    this.log = new EventLog(ui.log, ui.logCount);
    this.transcript = new Transcript(ui);
    this.downloads = new Downloads(ui);
    this.waveform = new Waveform(ui.wave);
    this.model = new ServedModel(ui, this.status);
    this.call = null; // the one live call
    this.keyTimer = 0;
  }

  get volume() {
    return Number(this.ui.volume.value) / 100;
  }

  showPreview() {
    this.ui.preview.textContent = JSON.stringify(sessionUpdate(this.ui.prompt.value, this.ui.seed.value));
  }

  resetView() {
    this.figures.reset();
    this.status.clearErrors();
    this.transcript.reset();
    delete this.ui.stats.dataset.closeCode;
    this.ui.statSession.textContent = "–";
    this.status.notice(null);
    this.downloads.clear();
    this.figures.render();
  }

  async start() {
    if (this.call) return;
    this.resetView();
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      this.status.set("nomic", "no microphone");
      this.status.notice("nomic", "The microphone needs a secure page.", "Open it from localhost or over HTTPS.");
      return;
    }
    this.status.set("connecting", "opening microphone…");
    let audio = null;
    try {
      audio = await CallAudio.open(this.ui.mic.value, this.ui.echo.checked, this.volume);
      this.ui.echoApplied.textContent = audio.echoReport();
      listMics(this.ui.mic).catch(() => {});
      await audio.resume();
      this.ui.stats.dataset.sampleRate = String(audio.ctx.sampleRate);
      this.status.set("connecting", "connecting…");
      this.connect(audio);
    } catch (err) {
      if (err instanceof MicError && this.micProblem(err.cause)) return;
      this.status.error(err && err.message ? err.message : String(err));
      this.status.set("error", "could not start");
      this.call = null;
      if (audio) {
        audio.stopCapture();
        audio.close();
      }
    }
  }

  connect(audio) {
    let ws;
    try {
      ws = new WebSocket(realtimeUrl(), subprotocols(this.ui.apiKey.value.trim()));
    } catch (err) {
      throw new Error(`cannot open the WebSocket (is the API key a plain token?): ${err.message}`);
    }
    this.call = new Call(this, audio, ws);
    this.log.startClock(performance.now());
    this.log.event("→", "connect", realtimeUrl());
    this.waveform.start(() => (this.call ? [this.call.audio.micAnalyser, this.call.audio.outAnalyser] : null));
  }

  micProblem(err) {
    const name = err && err.name;
    if (name === "NotAllowedError" || name === "SecurityError") {
      this.status.set("denied", "microphone blocked");
      this.status.notice("denied", "Microphone permission denied.", "Allow the microphone for this page (the icon in the address bar) and press Start again.");
    } else if (name === "NotFoundError" || name === "OverconstrainedError" || name === "NotReadableError") {
      this.status.set("nomic", "no microphone");
      this.status.notice("nomic", "No usable microphone.",
        name === "NotReadableError"
          ? "The microphone is in use by another program or failed to start."
          : "Plug one in, or pick another in the Microphone list.");
    } else {
      return false;
    }
    this.status.error(`microphone: ${name}: ${err.message || ""}`);
    return true;
  }

  stop() {
    if (this.call) this.call.stop();
  }

  async closed(call, event) {
    if (this.call !== call) return;
    this.call = null;
    call.audio.stopCapture();
    const { values } = this.figures;
    values.inputLevelDb = -120; // the microphone is off now
    this.log.stopClock();
    this.log.event("×", "close", `code ${event.code}${event.reason ? " " + event.reason : ""}`);
    this.ui.stats.dataset.closeCode = String(event.code);
    // Let queued speech finish, then release the audio device.
    call.audio.close(Math.max(0, values.bufferedMs) + 500);
    if (call.recording && !call.recording.empty) this.downloads.offer(call.recording, call.conversation());
    await this.explainClose(call, event);
    this.figures.schedule();
  }

  async explainClose(call, event) {
    const { status } = this;
    if (event.code === 1013 || call.busy) {
      // The close reason is the server's message too (shortened to fit a close frame).
      status.busy(call.busyMessage || event.reason);
      const why = event.reason ? `: ${event.reason}` : ", try again later";
      if (!call.busy) status.error(`server busy (1013)${why}`);
    } else if (event.code === 1006 && call.state === "connecting") {
      await this.explainRefusal();
    } else if (event.code === 1006) {
      const gone = (await probeModels(this.ui.apiKey.value.trim())).status === 0;
      status.set(gone ? "gone" : "error", gone ? "server gone" : "connection lost");
      status.notice(gone ? "gone" : "error", gone ? "The server went away." : "The connection was lost.",
        gone ? "The session ended when the server stopped." : "The network dropped the connection.");
      status.error(`connection lost (code 1006)${gone ? ": the server is gone" : ""}`);
    } else if (call.state === "done" && event.code === 1000) {
      status.set("closed", "finished");
    } else if (event.code === 1000 || event.code === 1005) {
      status.set("closed", "closed");
    } else {
      const why = event.reason ? `: ${event.reason}` : "";
      status.error(`connection closed (code ${event.code})${why}`);
      status.set("error", `closed (${event.code})`);
    }
  }

  // Browsers hide the HTTP status of a refused upgrade: ask /v1/models why.
  async explainRefusal() {
    const { status } = this;
    status.set("connecting", "checking why…");
    const probe = await probeModels(this.ui.apiKey.value.trim());
    if (probe.status === 401) {
      status.set("unauthorized", "wrong API key");
      status.notice("unauthorized", "Wrong or missing API key.", "The server refused the key (HTTP 401). Enter the key it was started with (--api-key).");
      status.error("could not connect: missing or wrong API key (HTTP 401)");
    } else if (probe.status === 0) {
      status.set("gone", "server unreachable");
      status.gone();
      status.error("could not connect: the server is unreachable");
    } else {
      status.set("error", "refused");
      status.notice("error", "The server refused the WebSocket.", "The key is fine, so the page's Origin is probably not allowed: start the server with --allowed-origin.");
      status.error("could not connect: the server refused the WebSocket upgrade (Origin not allowed?)");
    }
  }

  wire() {
    const { ui } = this;
    const mics = () => listMics(ui.mic).catch(() => {});
    ui.form.addEventListener("submit", (e) => {
      e.preventDefault();
      this.start();
    });
    ui.stop.addEventListener("click", () => this.stop());
    ui.apiKey.addEventListener("input", () => {
      clearTimeout(this.keyTimer);
      this.keyTimer = setTimeout(() => this.model.load(), 400);
    });
    ui.prompt.addEventListener("input", () => this.showPreview());
    ui.seed.addEventListener("input", () => this.showPreview());
    ui.volume.addEventListener("input", () => {
      ui.volumeValue.textContent = `${ui.volume.value} %`;
      if (this.call) this.call.audio.setVolume(this.volume);
    });
    ui.micRefresh.addEventListener("click", mics);
    if (navigator.mediaDevices && navigator.mediaDevices.addEventListener) {
      navigator.mediaDevices.addEventListener("devicechange", mics);
    }
    window.addEventListener("beforeunload", () => {
      if (this.call) this.call.ws.close(1000, "page closed");
    });
  }

  boot() {
    this.wire();
    this.status.set("idle", "idle");
    this.showPreview();
    this.figures.render();
    listMics(this.ui.mic).catch(() => {});
    this.model.load();
  }
}

// The page's one App. A test page that imports this module for its pure units (and
// has no settings form) gets none.
if ($("settings")) new App(findElements()).boot();
