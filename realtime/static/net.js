// What the page asks the server over HTTP (the models, /ready) and the browser (its
// microphones), and the WebSocket's address and subprotocols.

import { KEY_PREFIX, SUBPROTOCOL, parseRetryAfter } from "./format.js";

export function realtimeUrl() {
  const url = new URL("/v1/realtime", window.location.href);
  url.protocol = window.location.protocol === "https:" ? "wss:" : "ws:";
  return url.href;
}

// Browsers cannot set headers on a WebSocket, so the key travels as a second
// subprotocol; the server answers with plain "realtime" and never echoes it.
export function subprotocols(key) {
  return key ? [SUBPROTOCOL, KEY_PREFIX + key] : [SUBPROTOCOL];
}

function authHeaders(key) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// GET /v1/models: {status, entry} or status 0 when the server cannot be reached.
export async function probeModels(key) {
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
export async function probeReady(key) {
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

export async function listMics(select) {
  if (!navigator.mediaDevices || !navigator.mediaDevices.enumerateDevices) return;
  const devices = await navigator.mediaDevices.enumerateDevices();
  const mics = devices.filter((d) => d.kind === "audioinput" && d.deviceId !== "default");
  const chosen = select.value;
  select.textContent = "";
  select.append(new Option("System default", ""));
  mics.forEach((d, i) => select.append(new Option(d.label || `Microphone ${i + 1}`, d.deviceId)));
  select.value = [...select.options].some((o) => o.value === chosen) ? chosen : "";
}


// --- a call's socket, resumed after a dropped connection ---------------------------
// The same rules as the Python client (realtime/client/resume.py): the page asks for
// a resumable session (?resumable=1), counts the server's events (the link messages
// aside) and acknowledges them, keeps what it sent within a byte and an age bound,
// and after a drop with no close frame (1006) reconnects to the same path
// (?resume=1&replica=...) at once, then 0.25, 0.5, 1, 2, 4, 4 ... s apart until the
// grace the server announced runs out. The call sees one stream of events.

export const ACK_EVERY_EVENTS = 64;
export const ACK_EVERY_MS = 1000;
export const OUTBOX_MAX_BYTES = 8 * 1024 * 1024;
export const OUTBOX_MAX_MS = 60_000;
export const RESUME_ANSWER_MS = 10_000;
const LINK_EVENTS = new Set(["session.resumable", "session.resumed"]);
const LINK_ERRORS = new Set(["invalid_ack", "resume_failed", "resync_required"]);

// Milliseconds before reconnect `attempt` (0-based).
export function backoffMs(attempt) {
  return attempt <= 0 ? 0 : Math.min(250 * 2 ** (attempt - 1), 4000);
}

// `url` with `params` set in its query and the names in `drop` removed.
export function withQuery(url, drop, params) {
  const u = new URL(url);
  for (const name of [...drop, ...Object.keys(params)]) u.searchParams.delete(name);
  for (const [name, value] of Object.entries(params)) u.searchParams.set(name, value);
  return u.href;
}

export function resumeUrl(url, replica) {
  const params = replica ? { resume: "1", replica } : { resume: "1" };
  return withQuery(url, ["resumable", "resume", "replica"], params);
}

// session.resumable as {token, replica, graceMs}, or null when unusable.
export function parseOffer(event) {
  const { token, replica, grace_seconds: grace } = event;
  if (typeof token !== "string" || !token) return null;
  if (replica != null && (typeof replica !== "string" || !replica)) return null;
  if (typeof grace !== "number" || !Number.isFinite(grace) || grace <= 0) return null;
  return { token, replica: replica || null, graceMs: grace * 1000 };
}

// What the page sent, numbered 1, 2, ... as the server counts them.
export class Outbox {
  constructor(maxBytes = OUTBOX_MAX_BYTES, maxMs = OUTBOX_MAX_MS) {
    this.maxBytes = maxBytes;
    this.maxMs = maxMs;
    this.count = 0;
    this.kept = [];
    this.bytes = 0;
    this.dropped = 0; // the highest number no longer kept
  }

  add(text, now) {
    this.count += 1;
    this.kept.push({ n: this.count, at: now, text });
    this.bytes += text.length;
    while (this.kept.length && (this.bytes > this.maxBytes || now - this.kept[0].at > this.maxMs)) {
      const old = this.kept.shift();
      this.bytes -= old.text.length;
      this.dropped = old.n;
    }
    return this.count;
  }

  // The server took 1 .. received: forget those; false when it needs one not kept.
  confirm(received) {
    if (!Number.isInteger(received) || received > this.count || received < this.dropped) return false;
    while (this.kept.length && this.kept[0].n <= received) this.bytes -= this.kept.shift().text.length;
    this.dropped = Math.max(this.dropped, received);
    return true;
  }

  since(n) {
    return this.kept.filter((m) => m.n > n).map((m) => m.text);
  }
}

// The server's events numbered as it numbers them; when to acknowledge.
export class EventCounter {
  constructor(now) {
    this.seq = 0;
    this.acked = 0;
    this.ackedAt = now;
  }

  received(now) {
    this.seq += 1;
    if (this.seq - this.acked >= ACK_EVERY_EVENTS || now - this.ackedAt >= ACK_EVERY_MS) {
      this.acked = this.seq;
      this.ackedAt = now;
      return this.seq;
    }
    return null;
  }
}

const sleepMs = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// A call's WebSocket as the call uses one (send, close, onmessage, onclose), resumed
// across drops; onreconnecting and onresumed say when the link is down and back.
// A resume that fails ends it with onclose({code, reason, resumeError}).
export class CallSocket {
  constructor(url, protocols, resume = true) {
    this.url = url;
    this.protocols = protocols;
    this.resume = resume;
    this.onmessage = null;
    this.onclose = null;
    this.onreconnecting = null;
    this.onresumed = null;
    this.offer = null;
    this.counter = new EventCounter(performance.now());
    this.outbox = new Outbox();
    this.resumes = 0;
    this.reconnecting = false;
    this.closed = false;
    this.attach(new WebSocket(resume ? withQuery(url, [], { resumable: "1" }) : url, protocols));
  }

  attach(ws) {
    this.ws = ws;
    ws.onmessage = (e) => this.message(e.data);
    ws.onerror = () => {}; // the details (close code) arrive with onclose
    ws.onclose = (e) => this.dropped(ws, e);
  }

  // True when the message went out or is kept to go out after a resume.
  send(text) {
    if (this.closed) return false;
    if (this.resume) this.outbox.add(text, performance.now());
    if (this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(text);
      return true;
    }
    return this.resume && this.offer !== null;
  }

  close(code, reason) {
    if (this.reconnecting) {
      this.finish({ code, reason: reason || "" });
      return;
    }
    this.ws.close(code, reason);
  }

  message(data) {
    // Only a link message or an error needs a look before the call's own parse.
    if (typeof data === "string" && (data.includes("session.resum") || data.includes("error"))) {
      let event = null;
      try {
        event = JSON.parse(data);
      } catch {
        // the call reports it
      }
      if (event && LINK_EVENTS.has(event.type)) {
        if (event.type === "session.resumable") this.offer = parseOffer(event);
        return;
      }
      if (event && event.type === "error" && event.error && LINK_ERRORS.has(event.error.code)) return;
    }
    const ack = this.counter.received(performance.now());
    if (ack !== null && this.offer && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ type: "session.event_ack", seq: ack }));
    }
    if (this.onmessage) this.onmessage({ data });
  }

  dropped(ws, event) {
    if (ws !== this.ws || this.closed) return;
    if (this.offer && event.code === 1006) this.reconnect(event);
    else this.finish(event);
  }

  finish(event) {
    if (this.closed) return;
    this.closed = true;
    this.reconnecting = false;
    if (this.onclose) this.onclose(event);
  }

  async reconnect(event) {
    this.reconnecting = true;
    if (this.onreconnecting) this.onreconnecting();
    const deadline = performance.now() + this.offer.graceMs;
    let tries = 0;
    for (let attempt = 0; ; attempt++) {
      const wait = backoffMs(attempt);
      if (performance.now() + wait >= deadline) break;
      await sleepMs(wait);
      if (this.closed) return;
      tries += 1;
      const result = await this.tryResume();
      if (this.closed) return;
      if (result === "ok") {
        this.reconnecting = false;
        this.resumes += 1;
        if (this.onresumed) this.onresumed();
        return;
      }
      if (result !== "retry") {
        this.finish({ code: 1008, reason: `${result.code}: ${result.message}`, resumeError: result });
        return;
      }
    }
    const grace = this.offer.graceMs / 1000;
    this.finish({ code: event.code, reason: `not resumed within the ${grace} s grace period (${tries} tries)`, resumeError: { code: "resume_expired", message: `no resume within ${grace} s` } });
  }

  // One resume on a new socket: "ok" (it is now this one's), "retry", or the error.
  tryResume() {
    return new Promise((resolve) => {
      let settled = false;
      let ws;
      const settle = (result) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if (result !== "ok") ws.close();
        resolve(result);
      };
      const timer = setTimeout(() => settle("retry"), RESUME_ANSWER_MS);
      try {
        ws = new WebSocket(resumeUrl(this.url, this.offer.replica), this.protocols);
      } catch (err) {
        clearTimeout(timer);
        resolve({ code: "resume_failed", message: err.message });
        return;
      }
      ws.onopen = () => ws.send(JSON.stringify({ type: "session.resume", token: this.offer.token, last_seq: this.counter.seq }));
      ws.onclose = () => settle("retry");
      ws.onerror = () => {};
      ws.onmessage = (e) => {
        let answer = {};
        try {
          answer = JSON.parse(e.data);
        } catch {
          // below: not the answer
        }
        if (answer.type === "session.resumed" && answer.last_seq === this.counter.seq) {
          if (!this.outbox.confirm(answer.received)) {
            settle({ code: "input_lost", message: "the page no longer holds what the server missed" });
            return;
          }
          // Synchronous: nothing else runs before the re-sends are out and the socket
          // is the call's (the replayed events follow on it).
          for (const text of this.outbox.since(answer.received)) ws.send(text);
          this.attach(ws);
          settle("ok");
        } else if (answer.type === "error" && answer.error && answer.error.code !== "server_busy") {
          settle({ code: answer.error.code || "error", message: answer.error.message || "" });
        } else if (answer.type === "error") {
          settle("retry");
        } else {
          settle({ code: "protocol", message: `unexpected answer to session.resume: ${answer.type}` });
        }
      };
    });
  }
}
