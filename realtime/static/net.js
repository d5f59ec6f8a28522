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

