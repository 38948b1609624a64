// The HTTP side of the browser API: the access token, client-request envelopes posted with the bearer,
// answers to server requests (client-response → receipt) and the JSONL export.
//
// Envelopes (DECISIONS.md, "Browser envelopes"):
//   client-request  {kind:"client-request", rpcId, method, payload}      POST /api/<method>
//   server-response {kind:"server-response", rpcId, value} | {…, error:{code, message, data?}}
//   client-response {kind:"client-response", rpcId, value} | {…, error}  POST /api/respond → receipt
// Problems of the carrier come back as HTTP statuses; business outcomes are HTTP 200 with `error`.

const TOKEN_KEY = "agenthost.token";

// The error categories of the wire (DECISIONS.md).
export const CATEGORIES = Object.freeze([
  "bad-request",
  "unauthorized",
  "forbidden",
  "not-found",
  "unavailable",
  "cancelled",
  "agent-busy",
  "timeout",
  "internal",
]);

// A typed failure of a call. `code` is one of CATEGORIES (or "network" when no HTTP answer arrived,
// "protocol" when the answer was not a valid server-response); `status` is the HTTP status when there was one.
export class ApiError extends Error {
  constructor(code, message, { status = 0, data, rpcId, method, correlationId } = {}) {
    super(message);
    this.name = "ApiError";
    this.code = code;
    this.status = status;
    this.data = data;
    this.rpcId = rpcId;
    this.method = method;
    this.correlationId = correlationId;
  }
}

const STATUS_CATEGORY = new Map([
  [400, "bad-request"],
  [401, "unauthorized"],
  [403, "forbidden"],
  [404, "not-found"],
  [405, "bad-request"],
  [408, "timeout"],
  [411, "bad-request"],
  [413, "bad-request"],
  [415, "bad-request"],
  [429, "unavailable"],
  [500, "internal"],
  [503, "unavailable"],
  [504, "timeout"],
]);

// Reads the token once at start: from the launch URL's fragment (`#k=TOKEN`, never sent to the server),
// which is then dropped from the address bar and history, else from this tab's sessionStorage (so a
// reload keeps working). No cookies are used (SECURITY.md §2.2).
export function takeToken(win = window) {
  let token = null;
  const hash = win.location.hash.startsWith("#") ? win.location.hash.slice(1) : "";
  if (hash) {
    const params = new URLSearchParams(hash);
    const k = params.get("k");
    if (k) {
      token = k;
      params.delete("k");
      const rest = params.toString();
      const url = win.location.pathname + win.location.search + (rest ? "#" + rest : "");
      win.history.replaceState(win.history.state, "", url);
    }
  }
  try {
    if (token) win.sessionStorage.setItem(TOKEN_KEY, token);
    else token = win.sessionStorage.getItem(TOKEN_KEY);
  } catch {
    // Storage may be unavailable (privacy settings): the token then lives in memory only.
  }
  return token;
}

export function storeToken(token, win = window) {
  try {
    if (token) win.sessionStorage.setItem(TOKEN_KEY, token);
    else win.sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // memory only
  }
}

export function newRpcId() {
  if (globalThis.crypto?.randomUUID) return crypto.randomUUID();
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

// Stage one of the two-stage parse of an answer: the server-response envelope. The value or the error's
// data stay opaque here; each caller checks the shape it expects.
export function parseServerResponse(body, rpcId) {
  if (!isObject(body) || body.kind !== "server-response" || typeof body.rpcId !== "string") {
    throw new ApiError("protocol", "the answer is not a server-response envelope", { rpcId });
  }
  if (rpcId !== undefined && body.rpcId !== rpcId) {
    throw new ApiError("protocol", "the answer's rpcId does not match the request", { rpcId });
  }
  const hasError = Object.hasOwn(body, "error");
  const hasValue = Object.hasOwn(body, "value");
  if (hasError === hasValue) {
    throw new ApiError("protocol", "a server-response has exactly one of value and error", { rpcId });
  }
  if (hasError) {
    const e = body.error;
    if (!isObject(e) || typeof e.code !== "string" || typeof e.message !== "string") {
      throw new ApiError("protocol", "malformed error in a server-response", { rpcId });
    }
    return { ok: false, error: e };
  }
  return { ok: true, value: body.value };
}

export class Api {
  constructor({ token = null, base = "", fetchImpl = (...a) => globalThis.fetch(...a), recorder = null } = {}) {
    this.token = token;
    this.base = base;
    this.fetch = fetchImpl;
    this.recorder = recorder; // this tab's recording (recorder.js): every POST body and its answer
    this.httpSeq = 0;
  }

  headers(extra = {}) {
    const h = { ...extra };
    if (this.token) h.Authorization = "Bearer " + this.token;
    return h;
  }

  async post(path, envelope, signal) {
    let res;
    const sent = JSON.stringify(envelope);
    const corr = "h" + ++this.httpSeq; // pairs the body with its answer in the recording
    this.recorder?.message("sent", sent, { corr });
    try {
      res = await this.fetch(this.base + path, {
        method: "POST",
        headers: this.headers({ "Content-Type": "application/json" }),
        body: sent,
        credentials: "omit",
        cache: "no-store",
        signal,
      });
    } catch (err) {
      if (signal?.aborted) throw new ApiError("cancelled", "the call was aborted", { rpcId: envelope.rpcId });
      throw new ApiError("network", "the host could not be reached", { rpcId: envelope.rpcId });
    }
    let text = "";
    try {
      text = await res.text();
    } catch {
      throw new ApiError("network", "the answer was cut off", { status: res.status, rpcId: envelope.rpcId });
    }
    this.recorder?.message("received", text, { corr, status: res.status });
    let body = null;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      body = null;
    }
    return { res, body };
  }

  // Calls METHOD with PAYLOAD; resolves with the value, rejects with an ApiError.
  async call(method, payload = {}, { signal } = {}) {
    const rpcId = newRpcId();
    const { res, body } = await this.post(
      "/api/" + encodeURIComponent(method),
      { kind: "client-request", rpcId, method, payload },
      signal,
    );
    if (res.status !== 200) {
      const code = STATUS_CATEGORY.get(res.status) ?? (res.status >= 500 ? "internal" : "bad-request");
      let message = `HTTP ${res.status}`;
      let data;
      if (body && body.kind === "server-response" && isObject(body.error)) {
        if (typeof body.error.message === "string") message = body.error.message;
        data = body.error.data;
      } else if (body && typeof body.message === "string") {
        message = body.message;
      }
      const correlationId = body?.correlationId ?? body?.error?.data?.correlationId;
      throw new ApiError(body?.error?.code && CATEGORIES.includes(body.error.code) ? body.error.code : code, message, {
        status: res.status,
        data,
        rpcId,
        method,
        correlationId,
      });
    }
    const parsed = parseServerResponse(body, rpcId);
    if (!parsed.ok) {
      throw new ApiError(parsed.error.code, parsed.error.message, {
        status: 200,
        data: parsed.error.data,
        rpcId,
        method,
      });
    }
    return parsed.value;
  }

  // Answers the server request RPCID with a value or an error; resolves with the receipt
  // {accepted, reason?}.
  async respond(rpcId, outcome) {
    const env = { kind: "client-response", rpcId };
    if (Object.hasOwn(outcome, "error")) env.error = outcome.error;
    else env.value = outcome.value;
    const { res, body } = await this.post("/api/respond", env);
    if (res.status !== 200) {
      const message =
        body?.error?.message ?? (typeof body?.message === "string" ? body.message : `HTTP ${res.status}`);
      throw new ApiError(STATUS_CATEGORY.get(res.status) ?? "internal", message, { status: res.status, rpcId });
    }
    // The receipt may come bare or wrapped in a server-response.
    let receipt = body;
    if (isObject(body) && body.kind === "server-response") {
      const parsed = parseServerResponse(body);
      if (!parsed.ok) throw new ApiError(parsed.error.code, parsed.error.message, { status: 200, rpcId });
      receipt = parsed.value;
    }
    if (!isObject(receipt) || typeof receipt.accepted !== "boolean") {
      throw new ApiError("protocol", "the answer is not a receipt", { status: res.status, rpcId });
    }
    return receipt;
  }

  // The session's events as JSON Lines, fetched with the bearer (a plain link cannot carry it).
  async exportSession(sessionId) {
    let res;
    try {
      res = await this.fetch(this.base + "/api/sessions/" + encodeURIComponent(sessionId) + "/export", {
        headers: this.headers(),
        credentials: "omit",
        cache: "no-store",
      });
    } catch {
      throw new ApiError("network", "the host could not be reached");
    }
    if (!res.ok) {
      throw new ApiError(STATUS_CATEGORY.get(res.status) ?? "internal", `export failed: HTTP ${res.status}`, {
        status: res.status,
      });
    }
    return res.blob();
  }
}
