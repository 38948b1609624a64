// Browser side of the Remote client tests (remote.test.mjs): a transport for plugins/browser/ui/remote.js
// over the real host — POST /api/<method> with the bearer, and the host stream /api/ws/host (plus the mux
// stream, only recorded) — and a client built on it, exposed as `window.remoteTest`.
//
// The transport follows the contract at the top of remote.js: post() throws a NoConnectionError while the
// host stream is not open (the request is not sent), throws {category, message, data?} for a server-response
// error or a carrier failure once under way, and passes `signal` to fetch; onEvent(method, handler) gets the
// payloads of the host stream's frames. Every frame of both streams is recorded for the assertions.
import { RemoteClient, NoConnectionError, mergeSignals } from "/remote.js";

const STATUS_CATEGORY = { 400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 503: "unavailable" };

// crypto.randomUUID needs a secure context; a LAN page (plain http on a non-loopback address) is not one.
function rpcId() {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

class CarrierError extends Error {
  constructor(category, message, data) {
    super(message);
    this.name = "CarrierError";
    this.category = category;
    if (data !== undefined) this.data = data;
  }
}

export class HostTransport {
  constructor(token) {
    this.token = token;
    this.handlers = new Map();
    this.frames = { host: [], mux: [] };
    this.sockets = {};
    this.posts = []; // methods posted, in order
  }

  get connected() {
    return this.sockets.host?.readyState === WebSocket.OPEN;
  }

  #open(kind, path) {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + path;
    const ws = new WebSocket(url, ["agenthost.v1", "agenthost.bearer." + this.token]);
    this.sockets[kind] = ws;
    ws.onmessage = (ev) => {
      let env;
      try {
        env = JSON.parse(ev.data);
      } catch {
        this.frames[kind].push({ invalid: String(ev.data) });
        return;
      }
      this.frames[kind].push(env);
      if (kind === "host" && env?.kind === "server-request") this.dispatch(env.method, env.payload);
    };
    return new Promise((resolve, reject) => {
      ws.onopen = () => resolve();
      ws.onerror = () => reject(new Error(`${path}: the WebSocket failed`));
      ws.onclose = (ev) => reject(new Error(`${path}: closed (${ev.code})`));
    });
  }

  // Opens the host stream (and the mux stream after cursor 0, recorded only).
  async connect() {
    await Promise.all([this.#open("host", "/api/ws/host"), this.#open("mux", "/api/ws/mux?after=0")]);
  }

  disconnect() {
    for (const ws of Object.values(this.sockets)) ws.close(1000, "test");
  }

  dispatch(method, payload) {
    for (const h of [...(this.handlers.get(method) ?? [])]) h(payload);
  }

  onEvent(method, handler) {
    if (!this.handlers.has(method)) this.handlers.set(method, new Set());
    this.handlers.get(method).add(handler);
    return () => this.handlers.get(method)?.delete(handler);
  }

  async post(method, payload, { signal } = {}) {
    if (!this.connected) throw new NoConnectionError();
    this.posts.push(method);
    const id = rpcId();
    let res;
    try {
      res = await fetch("/api/" + method, {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: "Bearer " + this.token },
        body: JSON.stringify({ kind: "client-request", rpcId: id, method, payload }),
        credentials: "omit",
        cache: "no-store",
        signal,
      });
    } catch (err) {
      if (signal?.aborted) throw err;
      throw new CarrierError("unavailable", `the host could not be reached: ${err.message}`);
    }
    let body = null;
    try {
      body = await res.json();
    } catch {
      body = null;
    }
    if (body?.kind === "server-response" && body.error && typeof body.error.code === "string")
      throw new CarrierError(body.error.code, String(body.error.message ?? ""), body.error.data);
    if (res.status !== 200) throw new CarrierError(STATUS_CATEGORY[res.status] ?? "internal", `HTTP ${res.status}`);
    if (body?.kind !== "server-response" || body.rpcId !== id || !Object.hasOwn(body, "value"))
      throw new CarrierError("internal", "not a server-response envelope");
    return body.value;
  }
}

// The page's state for the tests: one transport, one client, the events the client delivered and the
// console warnings it wrote (the logger is wrapped, the console still gets them).
export async function setup(token) {
  const transport = new HostTransport(token);
  const warnings = [];
  const logger = {
    warn: (...a) => {
      warnings.push(a.map(String).join(" "));
      console.warn(...a);
    },
    error: (...a) => {
      warnings.push(a.map(String).join(" "));
      console.error(...a);
    },
    log: (...a) => console.log(...a),
  };
  const client = new RemoteClient(transport, { logger });
  const delivered = [];
  client.onRemoteEvent("*", (args, name) => delivered.push({ name, args }));
  const state = { transport, client, delivered, warnings, RemoteClient, NoConnectionError, mergeSignals };
  window.remoteTest = state;
  await transport.connect();
  return true;
}
