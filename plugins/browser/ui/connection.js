// The connection generation loop (PROTOCOLS.md API-CONNECTION-LOOP) and the frame pump (API-WS-CLIENT).
//
// A generation opens the mux stream (/api/ws/mux?after=CURSOR), the host stream (/api/ws/host) and calls
// host.describe, all three at once. It is ready when both streams are open and describe succeeded; if a
// stream never reports open, a 3 s guard lets a generation whose describe succeeded become ready anyway
// (degraded). Either stream ending, or describe failing, aborts the whole generation: both sockets are
// closed and a new generation is built after a backoff of 500 ms doubling to a 10 s cap, the delay drawn
// between half the current step and the step. A generation that became ready resets the attempt count.
//
// Frames: every downlink frame is a server-request envelope. Both streams are opened with ?batch=1, so a
// message carries a JSON array of envelopes, in order (all the host had queued for the socket when it could
// write: one message instead of hundreds under load); a message that is a single object is one envelope.
// Binary messages, invalid JSON, invalid envelopes and payloads that fail their method's schema are logged
// and dropped (each envelope of a batch on its own); they never end the generation — only a socket's end
// does. An exception thrown by the sink is logged and the pump goes on.

export const SUBPROTOCOL = "agenthost.v1";
export const BEARER_PREFIX = "agenthost.bearer.";

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isInt = (v) => Number.isSafeInteger(v);
const isStr = (v) => typeof v === "string";

export class FrameError extends Error {
  constructor(message) {
    super(message);
    this.name = "FrameError";
  }
}

// The request object of request.approval / request.question (the payload itself, or under `request`).
function requestOf(payload) {
  return isObject(payload?.request) ? payload.request : payload;
}

// Stage two: each known method's payload schema. Unknown methods pass through to the sink untouched.
const PAYLOAD_SCHEMAS = {
  "session.event": (p) => {
    const e = p.event;
    if (!isStr(p.sessionId) || !isObject(e)) return "needs sessionId and event";
    if (!isInt(e.seq) || e.seq < 1 || !isStr(e.kind)) return "event needs an integer seq and a kind";
    if (e.sessionId !== undefined && e.sessionId !== p.sessionId) return "event of another session";
    if (e.data !== undefined && !isObject(e.data)) return "event data must be an object";
    return null;
  },
  "session.delta": (p) => (isStr(p.sessionId) && isStr(p.text) ? null : "needs sessionId and text"),
  "session.reasoning": (p) => (isStr(p.sessionId) && isStr(p.text) ? null : "needs sessionId and text"),
  "session.progress": (p) =>
    isStr(p.sessionId) && isStr(p.callId) && typeof p.progress === "number" ? null : "needs sessionId, callId and progress",
  "tools.changed": (p) => (p.sessionId === undefined || isStr(p.sessionId) ? null : "sessionId must be a string"),
  "session.status": (p) => (isStr(p.sessionId) && isStr(p.status) ? null : "needs sessionId and status"),
  "session.created": (p) => (isObject(p.session) && isStr(p.session.id) ? null : "needs session.id"),
  "session.closed": (p) => (isStr(p.sessionId) ? null : "needs sessionId"),
  "session.deleted": (p) => (isStr(p.sessionId) ? null : "needs sessionId"),
  "session.updated": (p) =>
    isStr(p.sessionId) && (p.title === undefined || isStr(p.title)) && (p.tags === undefined || Array.isArray(p.tags))
      ? null
      : "needs sessionId; title a string and tags an array when present",
  "request.resolved": (p) => (isStr(p.id) ? null : "needs id"),
  "request.approval": (p) => {
    const r = requestOf(p);
    return isObject(r) && isStr(r.sessionId) ? null : "needs the request's sessionId";
  },
  "request.question": (p) => {
    const r = requestOf(p);
    return isObject(r) && isStr(r.sessionId) ? null : "needs the request's sessionId";
  },
  "stream/error": () => null,
};

// The envelopes of one downlink message: a batch (a JSON array) or a single envelope; throws FrameError
// when the message is not JSON text. The envelopes are not checked yet (parseEnvelope).
export function parseMessage(data) {
  if (!isStr(data)) throw new FrameError("binary frame");
  let v;
  try {
    v = JSON.parse(data);
  } catch {
    throw new FrameError("invalid JSON");
  }
  return Array.isArray(v) ? v : [v];
}

// Stage one (envelope) and stage two (payload) of a downlink message holding one envelope; throws FrameError.
export function parseFrame(data) {
  const list = parseMessage(data);
  if (list.length !== 1) throw new FrameError(`a batch of ${list.length} envelopes where one was expected`);
  return parseEnvelope(list[0]);
}

// Stages one and two of one envelope (a parsed value); throws FrameError.
export function parseEnvelope(env) {
  if (!isObject(env)) throw new FrameError("not an object");
  if (env.kind !== "server-request") throw new FrameError(`unexpected envelope kind ${JSON.stringify(env.kind)}`);
  if (!isStr(env.rpcId) || !isStr(env.method)) throw new FrameError("envelope needs rpcId and method");
  if (typeof env.replyRequired !== "boolean") throw new FrameError("envelope needs replyRequired");
  if (!Object.hasOwn(env, "payload")) throw new FrameError("envelope needs payload");
  const check = PAYLOAD_SCHEMAS[env.method];
  if (check) {
    if (!isObject(env.payload)) throw new FrameError(`${env.method}: payload must be an object`);
    const why = check(env.payload);
    if (why) throw new FrameError(`${env.method}: ${why}`);
  }
  // The host-wide cursor travels on the frame and/or inside the stored event.
  const cursor = isInt(env.cursor) ? env.cursor : isInt(env.payload?.event?.cursor) ? env.payload.event.cursor : null;
  return { method: env.method, rpcId: env.rpcId, replyRequired: env.replyRequired, payload: env.payload, cursor };
}

// The delay before reconnect attempt ATTEMPT (0-based): step = min(base·2^attempt, cap), drawn in
// [step/2, step].
export function backoffDelay(attempt, { baseMs = 500, capMs = 10000, random = Math.random } = {}) {
  const step = Math.min(baseMs * 2 ** Math.min(attempt, 30), capMs);
  return step / 2 + random() * (step / 2);
}

export class Connection {
  // api: an Api (for host.describe and the token); getAfter(): the mux cursor to resume after (or null);
  // sink.onFrame(frame, stream), sink.onReady(info), sink.onState(state): callbacks.
  constructor({
    api,
    getAfter = () => null,
    sink = {},
    wsBase = null,
    guardMs = 3000,
    describeTimeoutMs = 10000,
    baseMs = 500,
    capMs = 10000,
    random = Math.random,
    WebSocketImpl = globalThis.WebSocket,
    logger = console,
    recorder = null,
  }) {
    this.recorder = recorder; // this tab's recording (recorder.js): every frame, opens and losses
    this.api = api;
    this.getAfter = getAfter;
    this.sink = sink;
    this.wsBase = wsBase ?? (location.protocol === "https:" ? "wss://" : "ws://") + location.host;
    this.guardMs = guardMs;
    this.describeTimeoutMs = describeTimeoutMs;
    this.backoff = { baseMs, capMs, random };
    this.WebSocketImpl = WebSocketImpl;
    this.logger = logger;
    this.attempt = 0;
    this.generation = 0;
    this.stopped = true;
    this.current = null; // the running generation's finish()
    this.wake = null; // resolves the backoff sleep early
    this.dropped = 0;
    this.state = { state: "idle" };
  }

  setState(s) {
    this.state = { ...s, generation: this.generation, attempt: this.attempt };
    this.safe("onState", this.state);
  }

  // Runs a sink callback; an exception is logged and never stops the pump or the loop.
  safe(name, ...args) {
    const fn = this.sink[name];
    if (!fn) return;
    try {
      fn(...args);
    } catch (err) {
      this.logger.error(`agenthost: the ${name} handler failed`, err);
    }
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.loop();
  }

  stop() {
    this.stopped = true;
    this.current?.("stopped");
    this.wake?.();
    this.setState({ state: "stopped" });
  }

  // Ends the backoff wait (or the running generation) and connects at once.
  reconnectNow() {
    if (this.stopped) return;
    if (this.wake) this.wake();
    else this.current?.("reconnect requested");
  }

  async loop() {
    while (!this.stopped) {
      const outcome = await this.runGeneration();
      if (this.stopped) break;
      const delay = backoffDelay(this.attempt, this.backoff);
      this.attempt++;
      this.setState({
        state: outcome.unauthorized ? "unauthorized" : "waiting",
        reason: outcome.reason,
        retryAt: Date.now() + delay,
      });
      await new Promise((resolve) => {
        const t = setTimeout(resolve, delay);
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.wake = null;
    }
  }

  runGeneration() {
    const gen = ++this.generation;
    this.setState({ state: "connecting" });
    return new Promise((resolve) => {
      const ac = new AbortController();
      const open = { mux: false, host: false };
      const sockets = [];
      let described = false;
      let describeValue = null;
      let guardPassed = false;
      let ready = false;
      let ended = false;
      let unauthorized = false;
      let guard = null;
      let describeTimer = null;

      const finish = (reason) => {
        if (ended) return;
        ended = true;
        clearTimeout(guard);
        clearTimeout(describeTimer);
        ac.abort();
        for (const ws of sockets) {
          ws.onopen = ws.onmessage = ws.onerror = ws.onclose = null;
          try {
            ws.close(1000);
          } catch {
            // already closing
          }
        }
        if (this.current === finish) this.current = null;
        this.recorder?.mark(this.stopped ? "close" : "loss", `generation ${gen}: ${reason}`);
        this.logger.info?.(`agenthost: generation ${gen} ended: ${reason}`);
        resolve({ reason, wasReady: ready, unauthorized });
      };
      this.current = finish;

      const checkReady = () => {
        if (ended) return;
        const both = open.mux && open.host;
        if (!ready && described && (both || guardPassed)) {
          ready = true;
          this.recorder?.noteHost(describeValue);
          this.recorder?.mark("open", `generation ${gen}${both ? "" : " (degraded)"}`);
          this.attempt = 0; // a successful handshake resets the backoff
          this.setState({ state: both ? "ready" : "degraded" });
          this.safe("onReady", { generation: gen, describe: describeValue, degraded: !both });
        } else if (ready && both && this.state.state === "degraded") {
          this.setState({ state: "ready" });
        }
      };

      const openStream = (stream, path) => {
        let ws;
        try {
          ws = new this.WebSocketImpl(this.wsBase + path, [SUBPROTOCOL, BEARER_PREFIX + (this.api.token ?? "")]);
        } catch (err) {
          queueMicrotask(() => finish(`${stream} stream could not be opened: ${err.message}`));
          return;
        }
        ws.binaryType = "arraybuffer";
        sockets.push(ws);
        ws.onopen = () => {
          open[stream] = true;
          checkReady();
        };
        ws.onmessage = (ev) => this.pump(stream, ev.data, gen);
        ws.onerror = () => {
          // the close event follows and ends the generation
        };
        ws.onclose = (ev) => finish(`${stream} stream closed (${ev.code}${ev.reason ? " " + ev.reason : ""})`);
      };

      const after = this.getAfter();
      openStream("mux", "/api/ws/mux?batch=1" + (after !== null && after !== undefined ? "&after=" + after : ""));
      openStream("host", "/api/ws/host?batch=1");

      describeTimer = setTimeout(() => finish("host.describe timed out"), this.describeTimeoutMs);
      this.api.call("host.describe", {}, { signal: ac.signal }).then(
        (value) => {
          if (ended) return;
          clearTimeout(describeTimer);
          described = true;
          describeValue = value;
          checkReady();
        },
        (err) => {
          if (err?.code === "unauthorized") unauthorized = true;
          finish(`host.describe failed: ${err?.message ?? err}`);
        },
      );
      guard = setTimeout(() => {
        guardPassed = true;
        checkReady();
      }, this.guardMs);
    });
  }

  pump(stream, data, gen) {
    let list;
    try {
      list = parseMessage(data);
    } catch (err) {
      if (gen === this.generation) this.recorder?.message("received", isStr(data) ? data : "(a binary frame)");
      this.drop(stream, err);
      return;
    }
    for (const env of list) {
      // Recorded as frames of their own, as the host records them.
      if (gen === this.generation) this.recorder?.value("received", env);
      let frame;
      try {
        frame = parseEnvelope(env);
      } catch (err) {
        this.drop(stream, err);
        continue;
      }
      if (gen !== this.generation) return; // a late frame of an aborted generation
      this.safe("onFrame", frame, stream);
    }
  }

  drop(stream, err) {
    this.dropped++;
    this.logger.warn(`agenthost: ${stream} stream: dropped a frame (${err.message})`);
  }
}
