// The browser client for /v1/realtime: mic -> PCM16 frame appends, answer audio ->
// speakers through an adaptive jitter buffer. The page is a conversation first (both
// parties' turns, each replayable when the call ends); the live figures, the
// function channel, the errors and the event log sit in a Diagnostics section.
// No external resources, no build step.
//
// One App holds the page's state, split into small units that each keep their own:
// Figures (the live numbers and their rendering), StatusView (state, banners,
// errors), EventLog, Transcript, Downloads, Waveform, ServedModel, and per call a
// Call (the WebSocket session), its CallAudio (capture and playback nodes), Timing,
// Recording, MicWatch (a silent microphone) and, after Stop, AnswerWatch (has the
// answer ended?). The frame and the rates are the server's, from session.updated
// (sessionFormat); nothing before that message needs them.
//
// Stop ends the user's turn, not the call: the microphone goes off, the page goes on
// sending silence at the frame pace so the model can finish its answer, and commits
// once the answer has gone quiet or the bound (10 s by default) has passed; the
// server then answers response.done. A second Stop cuts the answer (response.cancel).

const SUBPROTOCOL = "realtime";
const KEY_PREFIX = "realtime-key.";
const LOG_LIMIT = 300; // event log entries kept
const RECORD_LIMIT_MS = 30 * 60 * 1000; // 30 min kept for the download
const METER_FLOOR_DB = -60;
const RTT_KEPT = 50; // round trips in the median
const RTF_WINDOW_MS = 5000; // audio received over this much wall time
const ACTIVE = ["connecting", "configuring", "live", "finishing", "committing", "waiting"];
export const ANSWER_LIMIT_S = 10; // after Stop, the answer may run this long (the default)
export const ANSWER_QUIET_MS = 1500; // model frames with no token and quiet audio: answer over
export const OUTPUT_QUIET_DB = -50; // an answer frame below this is quiet
const DONE_TIMEOUT_MS = 15000; // commit or cancel -> its answer, at most
export const MIC_SILENT_DB = -80; // a microphone frame below this is silence
export const MIC_WARN_MS = 2000; // silence (or no frame) this long: the warning
const MIC_CHECK_MS = 250;
export const RETRY_DEFAULT_S = 2; // between /ready probes when no Retry-After is given
const RETRY_LIMIT_MS = 2 * 60 * 1000; // Try again waits for a free conversation this long
export const TURN_GAP_MS = 1200; // a party quiet this long on the timeline: its next words open a turn
export const USER_LEAD_MS = 500; // a user turn's replay starts this much before its first word
export const ASSISTANT_TAIL_MS = 1000; // an answer's replay runs on this long (speech follows text)

// VoiceChat's figures: only for a field a server's session.updated leaves out.
export const DEFAULT_FORMAT = Object.freeze({ frameSamples: 1280, inputRate: 16000, outputRate: 22050 });

// null: not measured (shown as "—", and left out of #stats' data-* attributes).
const INITIAL_FIGURES = Object.freeze({
  appendsSent: 0,
  silenceSent: 0, // of appendsSent: the silence sent after Stop while the answer finished
  audioDeltas: 0,
  transcriptDeltas: 0,
  textDeltas: 0,
  functionDeltas: 0,
  lastFrameIndex: null,
  bufferedMs: null,
  latencyMs: null,
  targetMs: null,
  underruns: null,
  caughtUpMs: null,
  droppedMs: null,
  stretchedMs: null,
  errors: 0,
  inputLevelDb: null,
  outputLevelDb: null,
  rttMs: null,
  rttMedianMs: null,
  rtf: null,
});

const $ = (id) => document.getElementById(id);

// The level meters, one row each from the page's template: ids meter-<which>,
// meter-<which>-db and <which>-label, as Figures.meter reads them.
const METERS = [
  ["in", "Microphone"],
  ["out", "Model"],
];

function makeMeters() {
  const template = $("meter-row");
  for (const [which, label] of METERS) {
    const row = template.content.firstElementChild.cloneNode(true);
    const [name, meter, db] = row.children;
    name.id = `${which}-label`;
    name.textContent = label;
    meter.id = `meter-${which}`;
    meter.classList.add(which);
    meter.setAttribute("aria-labelledby", name.id);
    db.id = `meter-${which}-db`;
    template.parentNode.insertBefore(row, template);
  }
}

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

const DASH = "—";
const fmtMs = (ms) => (ms == null ? DASH : `${Math.round(ms)} ms`);

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

// RMS level of PCM16 in dB below full scale (-120 for digital silence).
export function levelDb(pcm) {
  let energy = 0;
  for (let i = 0; i < pcm.length; i++) energy += pcm[i] * pcm[i];
  const mean = pcm.length ? energy / pcm.length / (32768 * 32768) : 0;
  return Math.max(-120, 10 * Math.log10(mean + 1e-12));
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

// The answer's bound after Stop from the settings field: seconds in [0, 60].
export function answerLimitSeconds(text) {
  const s = Number.parseFloat(text);
  return Number.isFinite(s) && s >= 0 ? Math.min(60, s) : ANSWER_LIMIT_S;
}

// A Retry-After header in seconds: delay-seconds, or an HTTP date (from `nowMs`);
// null when absent or unreadable.
export function parseRetryAfter(value, nowMs = Date.now()) {
  if (value == null) return null;
  const text = String(value).trim();
  if (/^\d+$/.test(text)) {
    const s = Number(text);
    return s < 86400 ? s : null;
  }
  const at = Date.parse(text);
  return Number.isFinite(at) ? Math.max(0, Math.ceil((at - nowMs) / 1000)) : null;
}

// /ready's reason as a sentence for the busy banner.
export function readyReason(reason) {
  return (
    {
      busy: "Every conversation it serves is in use.",
      overloaded: "It is at its real-time capacity: one more conversation would make the others fall behind.",
      draining: "It is shutting down and takes no new conversations.",
      loading: "Its model is still loading.",
      engine_unavailable: "Its model engine is not running.",
      connection_limit: "It has too many open connections.",
    }[reason] || ""
  );
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

// GET /ready: {status, reason, retryAfter} (status 0: unreachable). A balancer in
// front may answer it too; either may say when to come back (Retry-After).
async function probeReady(key) {
  try {
    const response = await fetch("/ready", { headers: authHeaders(key), cache: "no-store" });
    let reason = "";
    try {
      const body = await response.json();
      reason = body.reason || (body.error && body.error.code) || "";
    } catch {
      // not JSON: a proxy's page
    }
    return { status: response.status, reason, retryAfter: parseRetryAfter(response.headers.get("Retry-After")) };
  } catch {
    return { status: 0, reason: "", retryAfter: null };
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

// ---------------------------------------------------------------- one call's watches

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

// Is the microphone delivering sound? "nothing": no frame for `afterMs`; "silent":
// frames, but none above `silentDb` for `afterMs`; null: fine.
export class MicWatch {
  constructor(now, { silentDb = MIC_SILENT_DB, afterMs = MIC_WARN_MS } = {}) {
    this.silentDb = silentDb;
    this.afterMs = afterMs;
    this.lastFrame = now;
    this.lastSound = now;
  }

  frame(db, now) {
    this.lastFrame = now;
    if (db > this.silentDb) this.lastSound = now;
  }

  check(now) {
    if (now - this.lastFrame >= this.afterMs) return "nothing";
    if (now - this.lastSound >= this.afterMs) return "silent";
    return null;
  }
}

// After Stop: has the answer ended? Frames from `stopFrame` on answer the silence
// the page sends. The answer is over ("quiet") once `quietMs` of them have come with
// no token on any channel and audio below `quietDb`, and in any case ("limit")
// `limitMs` of wall time after Stop.
export class AnswerWatch {
  constructor(frameMs, stopFrame, stoppedAt, limitMs, { quietMs = ANSWER_QUIET_MS, quietDb = OUTPUT_QUIET_DB } = {}) {
    this.quietFrames = Math.max(1, Math.round(quietMs / frameMs));
    this.quietDb = quietDb;
    this.stopFrame = stopFrame;
    this.deadline = stoppedAt + limitMs;
    this.lastVoice = -1; // the last frame that carried a token or audible audio
    this.lastFrame = -1; // the last answer frame received
  }

  token(frameIndex) {
    if (Number.isInteger(frameIndex)) this.lastVoice = Math.max(this.lastVoice, frameIndex);
  }

  audio(frameIndex, db) {
    this.lastFrame = Math.max(this.lastFrame, frameIndex);
    if (db > this.quietDb) this.lastVoice = Math.max(this.lastVoice, frameIndex);
  }

  verdict(now) {
    const quietFrom = Math.max(this.lastVoice + 1, this.stopFrame);
    if (this.lastFrame + 1 - quietFrom >= this.quietFrames) return "quiet";
    if (now >= this.deadline) return "limit";
    return null;
  }
}

// The audio kept for the download and the turns' replay: microphone frames in
// order, model frames by frame_index, 30 minutes of each at most.
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

  // Frames [first, end) of one channel, one after the other (a missing one as silence).
  span(role, first, end) {
    const frames = role === "user" ? this.mic : this.model;
    const size = role === "user" ? this.format.frameSamples : this.format.outputFrameSamples;
    const out = new Int16Array(Math.max(0, end - first) * size);
    for (let k = first; k < end; k++) if (frames[k]) out.set(frames[k].subarray(0, size), (k - first) * size);
    return out;
  }
}

// The frames [first, end) a turn's replay plays: a user turn from a little before its
// first word (transcription follows speech) to its last; an answer from its first
// token to a little after its last (speech follows text). null: nothing recorded.
export function turnSpan(turn, frameMs, micFrames, modelFrames) {
  if (!Number.isInteger(turn.frame) || turn.frame < 0 || !(frameMs > 0)) return null;
  const last = Number.isInteger(turn.last) ? turn.last : turn.frame;
  let first;
  let end;
  if (turn.role === "user") {
    first = Math.max(0, turn.frame - Math.round(USER_LEAD_MS / frameMs));
    end = Math.min(micFrames, last + 1);
  } else {
    first = turn.frame;
    end = Math.min(modelFrames, last + 1 + Math.round(ASSISTANT_TAIL_MS / frameMs));
  }
  return end > first ? { first, end } : null;
}

function writeWavHeader(view, frames, rate, channels = 2) {
  const text = (at, s) => [...s].forEach((ch, i) => view.setUint8(at + i, ch.charCodeAt(0)));
  const block = 2 * channels;
  text(0, "RIFF");
  view.setUint32(4, 36 + frames * block, true);
  text(8, "WAVE");
  text(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, channels, true);
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * block, true);
  view.setUint16(32, block, true);
  view.setUint16(34, 16, true);
  text(36, "data");
  view.setUint32(40, frames * block, true);
}

// Mono PCM16 WAV of `pcm` (Int16Array) at `rate`.
export function monoWav(pcm, rate) {
  const bytes = new ArrayBuffer(44 + pcm.length * 2);
  const view = new DataView(bytes);
  writeWavHeader(view, pcm.length, rate, 1);
  for (let i = 0; i < pcm.length; i++) view.setInt16(44 + i * 2, pcm[i], true);
  return bytes;
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

// The live numbers (also mirrored as data-* on #stats for scripts and tests; a
// figure not measured now has no attribute and reads "—") and their rendering, at
// most once per animation frame. `phase`: "none" (no call yet), "active", "ended".
class Figures {
  constructor(ui) {
    this.ui = ui;
    this.values = { ...INITIAL_FIGURES };
    this.phase = "none";
    this.playbackSource = null; // the CallAudio whose playback reports count
    this.queued = false;
  }

  reset() {
    Object.assign(this.values, INITIAL_FIGURES);
    this.playbackSource = null;
    this.phase = "active";
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

  // The playback worklet's report (about 20 a second) from `source`'s worklet.
  // Latency is a figure while audio plays; the target while more is expected.
  playback(msg, source) {
    if (source !== this.playbackSource) return;
    const v = this.values;
    v.bufferedMs = msg.bufferedMs;
    v.latencyMs = msg.playing ? msg.latencyMs : null;
    v.targetMs = msg.finished ? null : msg.targetMs;
    v.underruns = msg.underruns;
    v.caughtUpMs = msg.caughtUpMs;
    v.droppedMs = msg.droppedMs;
    v.stretchedMs = msg.stretchedMs;
    v.outputLevelDb = msg.playing ? Math.max(-120, msg.levelDb) : null;
    this.schedule();
  }

  playbackOpened(source) {
    this.playbackSource = source;
  }

  // The speakers are released: nothing plays, nothing is buffered.
  playbackClosed(source) {
    if (source !== this.playbackSource) return;
    this.playbackSource = null;
    Object.assign(this.values, { bufferedMs: null, latencyMs: null, targetMs: null, outputLevelDb: null });
    this.schedule();
  }

  micOff() {
    this.values.inputLevelDb = null;
    this.schedule();
  }

  // The call is over: what was live is no longer measured; the totals stay.
  ended() {
    this.phase = "ended";
    Object.assign(this.values, { inputLevelDb: null, rttMs: null, rtf: null });
    this.schedule();
  }

  render() {
    const { ui, values: v } = this;
    for (const [key, value] of Object.entries(v)) {
      if (value == null) delete ui.stats.dataset[key];
      else ui.stats.dataset[key] = String(key === "rtf" ? Math.round(value * 100) / 100 : Math.round(value));
    }
    ui.stats.dataset.phase = this.phase;
    const none = this.phase === "none";
    const silence = v.silenceSent ? ` (${v.silenceSent} of silence after Stop)` : "";
    ui.statFrames.textContent = none ? DASH : `${v.appendsSent}${silence} / ${v.audioDeltas}`;
    const median = v.rttMedianMs == null ? "" : ` (median ${fmtMs(v.rttMedianMs)})`;
    ui.statRtt.textContent = v.rttMs == null && !median ? DASH : `${fmtMs(v.rttMs)}${median}`;
    const target = v.targetMs == null ? "" : ` (target ${fmtMs(v.targetMs)})`;
    ui.statLatency.textContent = `${fmtMs(v.latencyMs)}${target}`;
    ui.statRtf.textContent = v.rtf == null ? DASH : `${v.rtf.toFixed(2)}×`;
    ui.statUnderruns.textContent = v.underruns == null ? DASH : String(v.underruns);
    ui.statCaughtUp.textContent = fmtMs(v.caughtUpMs);
    ui.statDropped.textContent = fmtMs(v.droppedMs);
    ui.figuresNote.textContent = {
      none: "No session yet: every figure reads — until it is measured.",
      active: "This session, as it runs. — : not measured now.",
      ended: "The session has ended: its totals stay; what was live reads —.",
    }[this.phase];
    this.meter("in", v.inputLevelDb);
    this.meter("out", v.outputLevelDb);
    const summary = [];
    if (v.rttMs != null) summary.push(`round trip ${fmtMs(v.rttMs)}`);
    if (v.latencyMs != null) summary.push(`playback ${fmtMs(v.latencyMs)}`);
    if (v.errors) summary.push(`${v.errors} error${v.errors === 1 ? "" : "s"}`);
    ui.diagSummary.textContent = summary.length ? `· ${summary.join(" · ")}` : "";
  }

  meter(which, db) {
    const meter = $(`meter-${which}`);
    const active = db != null;
    const value = active ? Math.max(METER_FLOOR_DB, Math.min(0, Math.round(db))) : METER_FLOOR_DB;
    meter.setAttribute("aria-valuenow", String(value));
    meter.setAttribute("aria-valuetext", active ? `${value} dBFS` : "off");
    const fill = (100 * (value - METER_FLOOR_DB)) / -METER_FLOOR_DB;
    meter.firstElementChild.style.width = `${fill}%`;
    meter.dataset.hot = String(value > -6);
    $(`meter-${which}-db`).textContent = active ? `${value} dB` : DASH;
  }
}

const HINTS = {
  idle: "Press Start talking, allow the microphone, and speak. Stop ends your turn; the answer then finishes.",
  connecting: "Connecting…",
  configuring: "Connecting…",
  live: "Speak now. Stop ends your turn and lets the answer finish.",
  finishing: "Your microphone is off; the answer is finishing (up to {limit} s). Stop again cuts it.",
  committing: "The answer is ending. Stop again cuts it.",
  waiting: "Waiting for a free conversation; Cancel stops waiting.",
  closed: "The conversation has ended. Play any turn again, or Start talking for a new one.",
  done: "The answer has ended.",
  busy: "The server is full. Try again waits for a free conversation.",
};
const OTHER_HINT = "See the banner above for what happened and what to do.";

// The state badge and the controls it enables, the banners, the error list.
class StatusView {
  constructor(ui, figures) {
    this.ui = ui;
    this.figures = figures;
    this.limitS = ANSWER_LIMIT_S;
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
    ui.stop.textContent =
      state === "finishing" || state === "committing" ? "Cut the answer" : state === "waiting" ? "Cancel" : "Stop";
    for (const el of [ui.apiKey, ui.mic, ui.echo, ui.prompt, ui.seed, ui.answerLimit]) el.disabled = active;
    ui.hint.textContent = (HINTS[state] || OTHER_HINT).replace("{limit}", String(this.limitS));
    if (state !== "live") this.micWarning(null);
    this.figures.render(); // figures and state change together for anyone watching both
  }

  // `actions`: which of the banner's buttons show ("retry", "cancel").
  notice(kind, title, text, actions = []) {
    const { notice } = this.ui;
    this.ui.retry.hidden = !actions.includes("retry");
    this.ui.retryCancel.hidden = !actions.includes("cancel");
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
    this.notice("busy", "The server is busy.", why, ["retry"]);
  }

  gone() {
    this.notice("gone", "The server cannot be reached.", "Is `realtime serve` still running?");
  }

  // The microphone delivers silence ("silent") or nothing ("nothing"); null: fine.
  micWarning(kind) {
    const { ui } = this;
    const was = ui.micWarning.dataset.kind || null;
    if (kind === was) return;
    if (!kind) {
      ui.micWarning.hidden = true;
      delete ui.micWarning.dataset.kind;
      if (ui.state.dataset.state === "live") ui.state.textContent = "live: speak now";
      return;
    }
    ui.micWarning.dataset.kind = kind;
    const seconds = MIC_WARN_MS / 1000;
    ui.micWarningTitle.textContent =
      kind === "nothing" ? "The microphone delivers no audio." : "The microphone delivers only silence.";
    ui.micWarningText.textContent =
      kind === "nothing"
        ? `Nothing has come from it for ${seconds} s: is it unplugged, or in use by another program? Pick another one under Settings, or press Stop.`
        : `For ${seconds} s it has been below ${MIC_SILENT_DB} dBFS: is it muted, or the wrong device? Pick another one under Settings, or press Stop.`;
    ui.micWarning.hidden = false;
    ui.state.textContent = kind === "nothing" ? "live: no audio from the microphone" : "live: the microphone is silent";
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

  // One append of `frameMs`; `silence`: the page's own silence after Stop.
  append(frameMs, silence = false) {
    const what = silence ? "of silence each, after Stop" : "PCM16 each";
    const text = (run) => `${run.t} → input_audio_buffer.append ×${run.n} (${Math.round(frameMs)} ms ${what})`;
    if (this.appends && this.appends.silence !== silence) this.appends = null;
    this.appends = this.grow(this.appends, { silence }, text);
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

// A turn's replay button: what it does and how long the audio is.
function replayLabel(seconds) {
  return `▶ replay ${seconds.toFixed(1)} s`;
}

// One replay at a time: a turn's ▶ button plays its audio from a WAV blob.
class Replays {
  constructor() {
    this.playing = null; // {audio, button}
    this.urls = [];
  }

  button(wav, seconds) {
    const url = URL.createObjectURL(new Blob([wav], { type: "audio/wav" }));
    this.urls.push(url);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "replay secondary small";
    button.dataset.src = url;
    button.dataset.durationMs = String(Math.round(seconds * 1000));
    button.setAttribute("aria-pressed", "false");
    button.textContent = replayLabel(seconds);
    button.title = `Play this turn's audio again (${seconds.toFixed(1)} s long)`;
    button.addEventListener("click", () => this.toggle(button));
    return button;
  }

  toggle(button) {
    const current = this.playing;
    this.stop();
    if (current && current.button === button) return;
    const audio = new Audio(button.dataset.src);
    const done = () => {
      button.setAttribute("aria-pressed", "false");
      button.textContent = replayLabel(Number(button.dataset.durationMs) / 1000);
      if (this.playing && this.playing.audio === audio) this.playing = null;
    };
    audio.addEventListener("ended", done);
    audio.addEventListener("pause", done);
    audio.addEventListener("playing", () => {
      button.setAttribute("aria-pressed", "true");
      button.textContent = "■ stop";
    });
    this.playing = { audio, button };
    audio.play().catch(done);
  }

  stop() {
    if (this.playing) this.playing.audio.pause();
    this.playing = null;
  }

  clear() {
    this.stop();
    for (const url of this.urls) URL.revokeObjectURL(url);
    this.urls = [];
  }
}

// The conversation: each party's words in turns on the model's timeline. A party's
// turn goes on while its words come less than TURN_GAP_MS apart (so in a full-duplex
// call both parties can hold a turn at once); the whole texts so far, and the
// function channel.
class Transcript {
  constructor(ui) {
    this.ui = ui;
    this.views = { user: ui.user, assistant: ui.assistant };
    this.frameMs = 0; // the session's, once session.updated has come
    this.replays = new Replays();
    this.reset();
  }

  reset() {
    this.user = "";
    this.assistant = "";
    this.fn = "";
    this.turns = [];
    this.open = { user: null, assistant: null };
    this.replays.clear();
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
    const frame = Number.isInteger(frameIndex) ? frameIndex : null;
    const follow = this.atBottom();
    let turn = this.open[role];
    const gap = this.frameMs > 0 ? TURN_GAP_MS / this.frameMs : Infinity;
    if (!turn || (frame !== null && turn.last !== null && frame - turn.last >= gap)) {
      const li = this.turnElement(role, frame);
      turn = { role, frame: frame === null ? -1 : frame, last: frame, text: "", li, el: li.querySelector("p") };
      this.turns.push(turn);
      this.open[role] = turn;
    }
    if (frame !== null) turn.last = Math.max(turn.last === null ? frame : turn.last, frame);
    turn.text += delta;
    turn.el.textContent = turn.text.trimStart();
    if (follow) turn.li.scrollIntoView({ block: "nearest" });
  }

  // Is the end of the conversation in view? Then the newest words are kept in view.
  atBottom() {
    const rect = this.ui.conversation.getBoundingClientRect();
    return rect.bottom <= window.innerHeight + 80;
  }

  turnElement(role, frameIndex) {
    const li = document.createElement("li");
    li.className = `turn ${role}`;
    const head = document.createElement("div");
    head.className = "who";
    const name = document.createElement("span");
    const known = frameIndex !== null && frameIndex >= 0 && this.frameMs > 0;
    const at = known ? ` · at ${((frameIndex * this.frameMs) / 1000).toFixed(1)} s` : "";
    name.textContent = (role === "user" ? "You" : "Assistant") + at;
    if (known) name.title = "When this turn began, counted from the start of the call";
    head.append(name);
    const body = document.createElement("p");
    li.append(head, body);
    this.ui.conversation.appendChild(li);
    this.ui.conversationEmpty.hidden = true;
    return li;
  }

  // The call has ended: each turn gets a button that plays its audio again.
  attachAudio(recording) {
    const { format } = recording;
    for (const turn of this.turns) {
      const span = turnSpan(turn, format.frameMs, recording.mic.length, recording.model.length);
      if (!span) continue;
      const pcm = recording.span(turn.role, span.first, span.end);
      const rate = turn.role === "user" ? format.inputRate : format.outputRate;
      const button = this.replays.button(monoWav(pcm, rate), pcm.length / rate);
      turn.li.querySelector(".who").append(button);
    }
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
    this.canvas.hidden = false;
    requestAnimationFrame(() => this.draw());
  }

  // Drawn while a call is on; with no call there is nothing to draw, so it is not shown.
  draw() {
    const { canvas } = this;
    const analysers = this.traces();
    canvas.hidden = !analysers;
    if (!analysers) return;
    const g = canvas.getContext("2d");
    const { width: w, height: h } = canvas;
    g.clearRect(0, 0, w, h);
    const styles = getComputedStyle(document.documentElement);
    g.strokeStyle = styles.getPropertyValue("--line");
    g.beginPath();
    g.moveTo(0, h / 2);
    g.lineTo(w, h / 2);
    g.stroke();
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
      ui.settingsPanel.open = true; // the key field is there
      this.status.notice(
        "key",
        key ? "Wrong API key." : "This server needs an API key.",
        key
          ? "The server refused it (HTTP 401). Check the key it was started with (--api-key)."
          : "Enter the key the server was started with (--api-key) under Settings.",
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
    this.closing = null;
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

  // The microphone off (its tracks stopped), while the capture worklet goes on
  // posting frames of silence at the same pace.
  muteCapture() {
    if (this.capture) this.capture.port.postMessage({ type: "mute" });
    this.releaseMic();
  }

  releaseMic() {
    if (this.source) {
      this.source.disconnect();
      this.source = null;
    }
    for (const track of this.stream.getTracks()) track.stop();
  }

  // The microphone and the capture off for good.
  stopCapture() {
    if (this.capture) {
      this.capture.port.postMessage({ type: "stop" });
      this.capture.disconnect();
      this.capture = null;
    }
    this.releaseMic();
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

  // Silence now: what is queued is dropped (the user cut the answer).
  silence() {
    if (this.playback) {
      this.playback.port.postMessage({ type: "reset" });
      this.playback.port.postMessage({ type: "finish" });
    }
  }

  setVolume(volume) {
    this.gain.gain.setTargetAtTime(volume, this.ctx.currentTime, 0.02);
  }

  // Resolves once the audio device is released.
  close(afterMs = 0) {
    if (!this.closing) {
      const { ctx } = this;
      this.closing = new Promise((resolve) => setTimeout(resolve, afterMs)).then(() =>
        ctx.close().catch(() => {}),
      );
    }
    return this.closing;
  }
}

// One WebSocket session: its phase, the server's figures once session.updated has
// come, and the handling of every server event. Phases: connecting, configuring,
// live, finishing (after Stop: silence out, the answer still coming), committing
// (the commit sent), done (response.done or response.cancelled came).
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
    this.micWatch = null;
    this.micTimer = 0;
    this.answer = null; // AnswerWatch, after Stop
    this.answerTimer = 0;
    this.doneTimer = 0;
    this.ending = null; // "done" or "cancelled": how the server ended it
    this.cutting = false; // the second Stop: response.cancel sent
    this.started = new Date().toISOString();
    ws.onmessage = (e) => this.receive(e.data);
    ws.onerror = () => {}; // the details (close code) arrive with onclose
    ws.onclose = (e) => app.closed(this, e);
  }

  get current() {
    return this.app.call === this;
  }

  send(message, silence = false) {
    if (this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(message));
    if (message.type === "input_audio_buffer.append") this.app.log.append(this.format.frameMs, silence);
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
        if (this.answer) this.answer.token(event.frame_index);
        break;
      case "response.text.delta":
        figures.values.textDeltas += 1;
        transcript.grow("assistant", event, event.text);
        if (this.answer) this.answer.token(event.frame_index);
        break;
      case "response.function.delta":
        figures.values.functionDeltas += 1;
        transcript.functionDelta(event);
        if (this.answer) this.answer.token(event.frame_index);
        break;
      case "response.audio.delta":
        this.audioDelta(event);
        break;
      case "input_audio_buffer.committed":
        if (this.state !== "done" && !this.cutting) status.set("committing", "finishing the answer…");
        break;
      case "response.done":
        this.ended("done");
        this.audio.finish();
        status.set("done", "done");
        break;
      case "response.cancelled":
        this.ended("cancelled");
        status.set("done", "cut");
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
    ui.statSession.textContent = this.sessionId || DASH;
    ui.stats.dataset.sessionId = this.sessionId || "";
    status.set("configuring", "configuring");
    this.send(sessionUpdate(ui.prompt.value, ui.seed.value));
  }

  // The session is ready, with its frame and rates: audio can flow both ways.
  updated(session) {
    const { app, audio } = this;
    this.format = sessionFormat(session);
    app.ui.stats.dataset.frameMs = String(this.format.frameMs);
    this.timing = new Timing(this.format.frameMs);
    this.recording = new Recording(this.format);
    app.transcript.frameMs = this.format.frameMs;
    app.figures.playbackOpened(audio);
    audio.openPlayback(this.format, (msg) => app.figures.playback(msg, audio));
    this.state = "live";
    app.status.set("live", "live: speak now");
    this.micWatch = new MicWatch(performance.now());
    this.micTimer = setInterval(() => this.checkMic(), MIC_CHECK_MS);
    audio.startCapture(this.format, (frame) => this.captured(frame));
  }

  checkMic() {
    if (!this.current || this.state !== "live" || !this.micWatch) return;
    this.app.status.micWarning(this.micWatch.check(performance.now()));
  }

  // A frame from the capture worklet: the microphone's, or (after Stop) its silence.
  captured(frame) {
    if (!this.current || (this.state !== "live" && this.state !== "finishing")) return;
    const silence = frame.silence === true;
    const { figures } = this.app;
    const index = figures.values.appendsSent;
    const sent = this.send(
      { type: "input_audio_buffer.append", audio: bytesToBase64(frame.pcm), sample_rate: this.format.inputRate },
      silence,
    );
    if (!sent) return;
    const now = performance.now();
    this.timing.sent(index, now);
    this.recording.addMic(new Int16Array(frame.pcm));
    figures.values.appendsSent += 1;
    if (silence) {
      figures.values.silenceSent += 1;
    } else if (this.micWatch) {
      figures.values.inputLevelDb = Math.max(-120, frame.levelDb);
      this.micWatch.frame(frame.levelDb, now);
    }
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
    if (values.lastFrameIndex !== null && index <= values.lastFrameIndex) {
      status.error(`audio frame_index went backwards (${index})`);
    }
    values.lastFrameIndex = index;
    log.audioFrame(index);
    Object.assign(values, this.timing.answered(index, now));
    const pcm = base64ToInt16(event.delta);
    this.recording.addModel(index, pcm);
    if (this.cutting) return; // the user cut the answer: nothing more is played
    this.audio.play(pcm);
    if (this.answer) {
      this.answer.audio(index, levelDb(pcm));
      this.checkAnswer();
    }
  }

  serverError(err) {
    if (err.code === "server_busy") {
      this.busy = true;
      this.busyMessage = err.message || "";
      this.app.status.busy(this.busyMessage);
    }
    this.app.status.error(`${err.code || "error"}: ${err.message || ""}`);
  }

  // Stop: a live call ends the user's turn and lets the answer finish; during that,
  // a second Stop cuts the answer; a call still setting up is closed.
  stop() {
    if (this.state === "live") this.finish();
    else if (this.state === "finishing" || this.state === "committing") this.cut();
    else if (this.state !== "done") this.ws.close(1000, "stopped by the user");
  }

  // The microphone off; silence goes on at the frame pace until the answer has gone
  // quiet or the bound has passed; then the commit.
  finish() {
    const { app } = this;
    const limitMs = 1000 * answerLimitSeconds(app.ui.answerLimit.value);
    this.stopMicWatch();
    this.state = "finishing";
    this.audio.muteCapture();
    app.figures.micOff();
    if (limitMs <= 0) {
      this.commit("at once");
      return;
    }
    const now = performance.now();
    const stopFrame = app.figures.values.appendsSent;
    app.ui.stats.dataset.stopFrame = String(stopFrame); // the first frame after Stop
    this.answer = new AnswerWatch(this.format.frameMs, stopFrame, now, limitMs);
    this.answerTimer = setInterval(() => this.checkAnswer(), 200);
    app.status.limitS = limitMs / 1000;
    app.status.set("finishing", "finishing the answer…");
  }

  checkAnswer() {
    if (this.state !== "finishing" || !this.answer) return;
    const verdict = this.answer.verdict(performance.now());
    if (verdict) this.commit(verdict);
  }

  // `why`: "quiet" (the answer went quiet), "limit" (the bound), "at once" (no bound).
  commit(why) {
    clearInterval(this.answerTimer);
    this.answer = null;
    this.state = "committing";
    this.app.ui.stats.dataset.finishedBy = why;
    this.audio.stopCapture();
    this.send({ type: "input_audio_buffer.commit", pad_partial: true });
    this.app.status.set("committing", "finishing the answer…");
    this.expectEnd("response.done");
  }

  // The second Stop: the answer is cut (response.cancel), and what is queued is not played.
  cut() {
    clearInterval(this.answerTimer);
    this.answer = null;
    this.cutting = true;
    this.audio.stopCapture();
    this.audio.silence();
    this.app.ui.stats.dataset.finishedBy = "cut";
    if (!this.send({ type: "response.cancel" })) {
      this.ws.close(1000, "cut by the user");
      return;
    }
    this.state = "committing";
    this.app.status.set("committing", "cutting the answer…");
    this.app.ui.hint.textContent = "Cutting the answer: nothing more of it is played.";
    this.app.ui.stop.disabled = true;
    this.expectEnd("response.cancelled");
  }

  // The server owes `what` and the close; if neither comes, the page closes.
  expectEnd(what) {
    clearTimeout(this.doneTimer);
    this.doneTimer = setTimeout(() => {
      if (!this.current) return;
      this.app.status.error(`no ${what} within ${DONE_TIMEOUT_MS / 1000} s: closing the connection`);
      this.ws.close(1000, "no answer to the commit");
    }, DONE_TIMEOUT_MS);
  }

  ended(how) {
    this.state = "done";
    this.ending = how;
    clearInterval(this.answerTimer);
    this.answer = null;
    this.stopMicWatch();
  }

  stopMicWatch() {
    clearInterval(this.micTimer);
    this.micWatch = null;
    this.app.status.micWarning(null);
  }

  // Every timer off: the connection has closed.
  dispose() {
    clearInterval(this.answerTimer);
    clearTimeout(this.doneTimer);
    this.stopMicWatch();
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
    form: "settings", settingsPanel: "settings-panel", settingsSummary: "settings-summary",
    apiKey: "api-key", mic: "mic", micRefresh: "mic-refresh",
    echo: "echo", echoApplied: "echo-applied", prompt: "system-prompt", seed: "seed",
    answerLimit: "answer-limit",
    preview: "update-preview", volume: "volume", volumeValue: "volume-value",
    start: "start", stop: "stop", hint: "hint", state: "state", model: "model", demo: "demo-banner",
    demoName: "demo-name", notice: "notice", noticeTitle: "notice-title",
    noticeText: "notice-text", retry: "retry", retryCancel: "retry-cancel",
    micWarning: "mic-warning", micWarningTitle: "mic-warning-title", micWarningText: "mic-warning-text",
    diagnostics: "diagnostics", diagSummary: "diag-summary", figuresNote: "figures-note",
    stats: "stats", statFrames: "stat-frames",
    statRtt: "stat-rtt", statLatency: "stat-latency", statRtf: "stat-rtf",
    statUnderruns: "stat-underruns", statCaughtUp: "stat-caught-up", statDropped: "stat-dropped",
    statSession: "stat-session",
    conversation: "conversation", conversationEmpty: "conversation-empty",
    user: "user-transcript", assistant: "assistant-text", fn: "function-text",
    errors: "errors", log: "log", logCount: "log-count", downloads: "downloads",
    downloadWav: "download-wav", downloadMd: "download-md", downloadJson: "download-json",
    wave: "wave",
  };
  return Object.freeze(Object.fromEntries(Object.entries(ids).map(([k, id]) => [k, $(id)])));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

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
    this.waiting = null; // {cancelled} while Try again waits for a free conversation
    this.keyTimer = 0;
  }

  get volume() {
    return Number(this.ui.volume.value) / 100;
  }

  get key() {
    return this.ui.apiKey.value.trim();
  }

  showSettings() {
    const { ui } = this;
    ui.preview.textContent = JSON.stringify(sessionUpdate(ui.prompt.value, ui.seed.value));
    const mic = ui.mic.selectedOptions[0] ? ui.mic.selectedOptions[0].textContent : "System default";
    const limit = answerLimitSeconds(ui.answerLimit.value);
    ui.settingsSummary.textContent = [
      mic === "System default" ? "default microphone" : mic,
      `echo cancellation ${ui.echo.checked ? "on" : "off"}`,
      `seed ${sessionUpdate("", ui.seed.value).session.seed}`,
      ui.prompt.value.trim() ? "system prompt set" : null,
      limit ? `answer up to ${limit} s after Stop` : "Stop ends at once",
    ]
      .filter(Boolean)
      .join(" · ");
    this.status.limitS = limit;
  }

  resetView() {
    this.figures.reset();
    this.status.clearErrors();
    this.transcript.reset();
    delete this.ui.stats.dataset.closeCode;
    delete this.ui.stats.dataset.finishedBy;
    delete this.ui.stats.dataset.stopFrame;
    this.ui.statSession.textContent = DASH;
    this.status.notice(null);
    this.downloads.clear();
    this.figures.render();
  }

  async start() {
    if (this.call || this.waiting) return;
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
      ws = new WebSocket(realtimeUrl(), subprotocols(this.key));
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
          : "Plug one in, or pick another in the Microphone list under Settings.");
    } else {
      return false;
    }
    this.status.error(`microphone: ${name}: ${err.message || ""}`);
    return true;
  }

  stop() {
    if (this.waiting) this.cancelWait();
    else if (this.call) this.call.stop();
  }

  // Try again: wait for /ready to say a conversation is free (it or a balancer in
  // front may say when to ask again: Retry-After), then start. Bounded by RETRY_LIMIT_MS.
  async retry() {
    if (this.call || this.waiting) return;
    const waiting = { cancelled: false };
    this.waiting = waiting;
    const { status, ui } = this;
    const give = (fn) => {
      if (this.waiting === waiting) this.waiting = null;
      fn();
    };
    status.notice(null);
    status.set("waiting", "waiting for a free conversation");
    const deadline = performance.now() + RETRY_LIMIT_MS;
    for (let attempt = 1; ; attempt++) {
      const ready = await probeReady(this.key);
      if (waiting.cancelled) return;
      if (ready.status === 200 || ready.status === 404) {
        give(() => this.start()); // 404: no /ready here (an older server or a proxy)
        return;
      }
      if (ready.status === 401) {
        give(() => {
          status.set("unauthorized", "wrong API key");
          this.model.load();
        });
        return;
      }
      if (ready.status === 0) {
        give(() => {
          status.set("gone", "server unreachable");
          status.gone();
        });
        return;
      }
      const given = ready.retryAfter;
      const seconds = Math.max(1, Math.min(60, given == null ? RETRY_DEFAULT_S : given));
      ui.stats.dataset.retryAfterS = String(seconds);
      if (performance.now() + seconds * 1000 > deadline) {
        give(() => {
          status.set("busy", "busy: no free conversation");
          status.notice("busy", "The server is still full.", `No conversation came free in ${RETRY_LIMIT_MS / 60000} minutes. ${readyReason(ready.reason)}`, ["retry"]);
        });
        return;
      }
      const why = readyReason(ready.reason) || `It answered HTTP ${ready.status}.`;
      const source = given == null ? "" : " (as its Retry-After says)";
      for (let left = seconds; left > 0; left--) {
        status.notice("waiting", "The server is full.", `${why} Trying again in ${left} s${source}; attempt ${attempt}.`, ["cancel"]);
        await sleep(1000);
        if (waiting.cancelled) return;
      }
    }
  }

  cancelWait() {
    if (!this.waiting) return;
    this.waiting.cancelled = true;
    this.waiting = null;
    this.status.set("busy", "busy: no free conversation");
    this.status.notice("busy", "Stopped waiting.", "The server was full. Try again when you like.", ["retry"]);
  }

  async closed(call, event) {
    if (this.call !== call) return;
    this.call = null;
    call.dispose();
    call.audio.stopCapture();
    const { values } = this.figures;
    this.figures.ended();
    this.log.stopClock();
    this.log.event("×", "close", `code ${event.code}${event.reason ? " " + event.reason : ""}`);
    this.ui.stats.dataset.closeCode = String(event.code);
    // Let queued speech finish (none after a cut), then release the audio device.
    const queued = call.cutting ? 0 : Math.max(0, values.bufferedMs || 0);
    call.audio.close(queued + 500).then(() => this.figures.playbackClosed(call.audio));
    if (call.recording && !call.recording.empty) {
      this.downloads.offer(call.recording, call.conversation());
      this.transcript.attachAudio(call.recording);
    }
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
      const gone = (await probeModels(this.key)).status === 0;
      status.set(gone ? "gone" : "error", gone ? "server gone" : "connection lost");
      status.notice(gone ? "gone" : "error", gone ? "The server went away." : "The connection was lost.",
        gone ? "The session ended when the server stopped." : "The network dropped the connection.");
      status.error(`connection lost (code 1006)${gone ? ": the server is gone" : ""}`);
    } else if (call.state === "done" && event.code === 1000) {
      status.set("closed", call.cutting ? "finished: the answer was cut" : "finished");
    } else if (event.code === 1000 || event.code === 1005) {
      status.set("closed", "closed");
    } else {
      const why = event.reason ? `: ${event.reason}` : "";
      status.error(`connection closed (code ${event.code})${why}`);
      status.set("error", `closed (${event.code})`);
    }
  }

  // Browsers hide the HTTP status of a refused upgrade: ask /v1/models and /ready why.
  async explainRefusal() {
    const { status } = this;
    status.set("connecting", "checking why…");
    const probe = await probeModels(this.key);
    if (probe.status === 401) {
      status.set("unauthorized", "wrong API key");
      this.ui.settingsPanel.open = true;
      status.notice("unauthorized", "Wrong or missing API key.", "The server refused the key (HTTP 401). Enter the key it was started with (--api-key) under Settings.");
      status.error("could not connect: missing or wrong API key (HTTP 401)");
      return;
    }
    if (probe.status === 0) {
      status.set("gone", "server unreachable");
      status.gone();
      status.error("could not connect: the server is unreachable");
      return;
    }
    const ready = await probeReady(this.key);
    if (ready.status === 503) {
      // Refused before the upgrade (HTTP 503 from the server or a balancer in front).
      status.set("busy", "busy: the server is full");
      const when = ready.retryAfter == null ? "" : ` It asks to come back in ${ready.retryAfter} s.`;
      status.notice("busy", "The server is full.", `${readyReason(ready.reason) || "It takes no new conversation now."}${when} Try again waits for a free one.`, ["retry"]);
      status.error(`could not connect: the server is full (/ready: 503${ready.reason ? " " + ready.reason : ""})`);
      return;
    }
    status.set("error", "refused");
    status.notice("error", "The server refused the WebSocket.", "The key is fine and the server has room, so the page's Origin is probably not allowed (start the server with --allowed-origin); behind a balancer that was full a moment ago, Try again.", ["retry"]);
    status.error("could not connect: the server refused the WebSocket upgrade (Origin not allowed?)");
  }

  wire() {
    const { ui } = this;
    const mics = () => listMics(ui.mic).catch(() => {});
    ui.form.addEventListener("submit", (e) => e.preventDefault());
    ui.start.addEventListener("click", () => this.start());
    ui.stop.addEventListener("click", () => this.stop());
    ui.retry.addEventListener("click", () => this.retry());
    ui.retryCancel.addEventListener("click", () => this.cancelWait());
    ui.apiKey.addEventListener("input", () => {
      clearTimeout(this.keyTimer);
      this.keyTimer = setTimeout(() => this.model.load(), 400);
    });
    for (const el of [ui.prompt, ui.seed, ui.answerLimit, ui.mic, ui.echo]) {
      el.addEventListener("input", () => this.showSettings());
      el.addEventListener("change", () => this.showSettings());
    }
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
    this.showSettings();
    this.figures.render();
    listMics(this.ui.mic).catch(() => {});
    this.model.load();
  }
}

// The page's one App. A test page that imports this module for its pure units (and
// has no settings form) gets none.
if ($("settings")) {
  makeMeters();
  new App(findElements()).boot();
}
