// This tab's recording (docs/usage.md "Recordings"): every message of its connection as sent or received —
// the uplink's POST bodies and their answers (correlated by `corr`), the downlink frames of both streams —
// with a per-connection sequence, wall and monotonic time, in the observation format `agenthost analyze`
// reads. Opt-in ("Record this tab"), kept in memory up to a cap, downloaded as FILE.jsonl + FILE.meta.json.
// Credentials are redacted by name before a record is kept; the bearer itself travels in headers and the
// WebSocket subprotocol, which are never recorded.

const CAP_BYTES = 64 * 1024 * 1024;
const KEY = "agenthost.record";

const CREDENTIAL_KEYS = new Set([
  "authorization", "proxy-authorization", "cookie", "set-cookie", "token", "access_token", "refresh_token",
  "id_token", "api_key", "apikey", "api-key", "x-api-key", "secret", "client_secret", "password", "passwd",
  "bearer", "bearer_token", "key", "private_key",
]);
const CREDENTIAL_SUFFIXES = ["_token", "_key", "-key", "_secret", "_password", "apikey", "accesstoken"];

function credentialKey(k) {
  const low = k.toLowerCase();
  return CREDENTIAL_KEYS.has(low) || CREDENTIAL_SUFFIXES.some((s) => low.endsWith(s));
}

function redactText(s) {
  return s.replace(/(Bearer |bearer |agenthost\.bearer\.|token=)[^ &#",\n]+/g, "$1[redacted]");
}

// A copy of V with credentials replaced.
export function redact(v) {
  if (typeof v === "string") return redactText(v);
  if (Array.isArray(v)) return v.map(redact);
  if (v && typeof v === "object") {
    const out = {};
    for (const [k, x] of Object.entries(v)) {
      out[k] = credentialKey(k) && x !== null && (typeof x === "string" || typeof x === "object") ? "[redacted]" : redact(x);
    }
    return out;
  }
  return v;
}

function runId() {
  const b = new Uint8Array(6);
  crypto.getRandomValues(b);
  return Date.now().toString(16).padStart(12, "0") + "-" + Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

export class Recorder {
  constructor({ source = "browser-ui", win = globalThis } = {}) {
    this.source = source;
    this.win = win;
    this.runId = runId();
    this.conn = "tab-" + this.runId.slice(-12);
    this.lines = [];
    this.bytes = 0;
    this.seq = 0;
    this.full = false;
    this.started = null;
    this.host = {}; // hostRunId, hostVersion, protocol from host.describe
    let on = false;
    try {
      on = win.sessionStorage?.getItem(KEY) === "1";
    } catch {
      // no storage
    }
    this.enabled = false;
    if (on) {
      this.setEnabled(true);
      this.mark("open", "recording started");
    }
  }

  setEnabled(on) {
    this.enabled = Boolean(on);
    try {
      if (on) this.win.sessionStorage?.setItem(KEY, "1");
      else this.win.sessionStorage?.removeItem(KEY);
    } catch {
      // memory only
    }
    if (on && !this.started) this.started = new Date().toISOString();
  }

  head() {
    return {
      v: 1,
      side: "client",
      source: this.source,
      conn: this.conn,
      seq: ++this.seq,
      wall: new Date().toISOString(),
      mono: Math.round(performance.now() * 1e6),
    };
  }

  push(rec) {
    const line = JSON.stringify(rec);
    if (this.bytes + line.length + 1 > CAP_BYTES) {
      // One loss record says the rest was not kept; nothing after it is.
      this.full = true;
      this.lines.push(JSON.stringify({ ...this.head(), event: "loss", detail: "the recording reached its cap" }));
      return;
    }
    this.lines.push(line);
    this.bytes += line.length + 1;
  }

  // A message as sent or received: TEXT is its body (parsed when it is JSON).
  message(dir, text, { corr, status } = {}) {
    if (!this.enabled || this.full) return;
    const rec = this.head();
    rec.dir = dir;
    if (corr) rec.corr = corr;
    if (status !== undefined) rec.status = status;
    try {
      rec.payload = redact(JSON.parse(text));
    } catch {
      rec.raw = redactText(String(text));
    }
    this.push(rec);
  }

  // A message already parsed (one envelope of a batched WebSocket message).
  value(dir, payload) {
    if (!this.enabled || this.full) return;
    const rec = this.head();
    rec.dir = dir;
    rec.payload = redact(payload);
    this.push(rec);
  }

  mark(event, detail) {
    if (!this.enabled || this.full) return;
    const rec = this.head();
    rec.event = event;
    if (detail) rec.detail = detail;
    this.push(rec);
  }

  noteHost(describe) {
    if (describe && typeof describe === "object") {
      this.host = { hostRunId: describe.runId, hostVersion: describe.version, protocol: describe.protocol };
    }
  }

  meta() {
    return redact({
      format: "agenthost.recording",
      version: 1,
      source: this.source,
      side: "client",
      recordingRunId: this.runId,
      ...this.host,
      userAgent: navigator.userAgent,
      clock: { mono: "performance.now", domain: "tab:" + performance.timeOrigin, unit: "ns" },
      started: this.started ?? new Date().toISOString(),
      part: 1,
      records: this.lines.length,
    });
  }

  // The two files of a download: [{name, blob}].
  files() {
    const base = `agenthost-${this.source}-${this.runId}`;
    return [
      { name: base + ".jsonl", blob: new Blob(this.lines.map((l) => l + "\n"), { type: "application/x-ndjson" }) },
      { name: base + ".meta.json", blob: new Blob([JSON.stringify(this.meta(), null, 2) + "\n"], { type: "application/json" }) },
    ];
  }
}
