// The page's figures and its pure helpers: session formats, PCM and text, the
// settings the page sends; no DOM, no network.

export const SUBPROTOCOL = "realtime";
export const KEY_PREFIX = "realtime-key.";
export const LOG_LIMIT = 300; // event log entries kept
export const RECORD_LIMIT_MS = 30 * 60 * 1000; // 30 min kept for the download
export const METER_FLOOR_DB = -60;
export const RTT_KEPT = 50; // round trips in the median
export const RTF_WINDOW_MS = 5000; // audio received over this much wall time
export const ACTIVE = ["connecting", "configuring", "live", "finishing", "committing", "reconnecting", "waiting"];
export const ANSWER_LIMIT_S = 10; // after Stop, the answer may run this long (the default)
export const ANSWER_QUIET_MS = 1500; // model frames with no token and quiet audio: answer over
export const OUTPUT_QUIET_DB = -50; // an answer frame below this is quiet
export const DONE_TIMEOUT_MS = 15000; // commit or cancel -> its answer, at most
export const MIC_SILENT_DB = -80; // a microphone frame below this is silence
export const MIC_WARN_MS = 2000; // silence (or no frame) this long: the warning
export const MIC_CHECK_MS = 250;
export const RETRY_DEFAULT_S = 2; // between /ready probes when no Retry-After is given
export const RETRY_LIMIT_MS = 2 * 60 * 1000; // Try again waits for a free conversation this long
export const TURN_GAP_MS = 1200; // a party quiet this long on the timeline: its next words open a turn
export const USER_LEAD_MS = 500; // a user turn's replay starts this much before its first word
export const ASSISTANT_TAIL_MS = 1000; // an answer's replay runs on this long (speech follows text)

// VoiceChat's figures: only for a field a server's session.updated leaves out.
export const DEFAULT_FORMAT = Object.freeze({ frameSamples: 1280, inputRate: 16000, outputRate: 22050 });

// null: not measured (shown as "—", and left out of #stats' data-* attributes).
export const INITIAL_FIGURES = Object.freeze({
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

export const DASH = "—";
export const fmtMs = (ms) => (ms == null ? DASH : `${Math.round(ms)} ms`);

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

