// Remote: the browser client of the host's typed services (PROTOCOLS.md REMOTE-CLIENT-MOUNT,
// REMOTE-CLIENT-INVOKE, REMOTE-EVENT-ALLOWLIST / FORWARD; docs/protocols/remote.md).
//
// An ES module without dependencies. It does not import the UI's other modules: it talks to the host through
// a small transport object, which the UI wires to its API and connection code and the tests wire to a real
// host:
//
//   transport.post(method, payload, { signal }) → Promise<value>
//       POSTs a client-request envelope for METHOD ("remote.describe", "remote.invoke") and resolves with the
//       server-response's value. It rejects with
//         - a NoConnectionError (exported here; any error with `noConnection === true` counts) when there is
//           no connection to the host, so the request was not sent — the client passes it on (throws);
//         - a typed error `{category, message, data?}` (an Error carrying those fields) for a server-response
//           error or a failure of the carrier once the request was under way (a lost connection: category
//           "unavailable"); `code` is read when `category` is absent, so the UI's ApiError fits as it is;
//         - anything, once SIGNAL aborted (the client reports "cancelled" on its own).
//       It should pass SIGNAL to fetch: aborting the HTTP request is what cancels the call on the host.
//   transport.onEvent(method, handler) → unsubscribe()
//       calls handler(payload) for every downlink frame (server-request envelope) of METHOD on the host
//       stream; the client subscribes to "host/remote-event" only.
//
// Use:
//
//   const client = new RemoteClient(transport);
//   const mount = client.mount(await client.describe());   // or any descriptor set
//   const r = await client.services.sessions.rename(sessionId, "a title", { signal });
//   if (r.ok) … r.value … else … r.error.category, r.error.message …
//   client.onRemoteEvent("session.created", (args, name) => …);   // → unsubscribe()
//   await mount.withdraw();
//
// Mount (REMOTE-CLIENT-MOUNT). A descriptor set (`{descriptors: […]}` as remote.describe answers, or the
// array) goes through a strict codec first: every descriptor must have exactly the fields of remote.describe
// with their types, names and types from the fixed lists; a set that fails is refused as a whole. Then, still
// before anything is published, a set naming one descriptor twice, a namespace that another mount holds, or
// a service name already present on the services object is refused. Each namespace is then installed as one
// frozen service object `services[namespace]` holding one function per method; if an install fails part-way,
// the namespaces already installed are removed again in reverse order and the mount is refused. Each mount
// owns one AbortController. withdraw() marks the mount inactive, aborts its in-flight calls (they resolve
// `cancelled` at once), then removes its methods; it returns a promise of the in-flight calls' settling.
//
// Invoke (REMOTE-CLIENT-INVOKE). `services.NS.METHOD(a1, …, an, options?)`: the positional arguments become
// the descriptor's named fields (optional trailing arguments may be left out; undefined or null for an
// optional one sends nothing); `options` is `{signal}` and sits right after the last parameter. Wrong arity or
// a value of the wrong type answers `{ok:false, error:{category:"bad-request"}}` naming the field, without a
// request. The caller's signal is merged with the mount's lifetime. The reply's value is checked again against
// the descriptor's result type. With no connection the call throws the NoConnectionError; otherwise every
// outcome is a RemoteResult: `{ok:true, value}` or `{ok:false, error:{category, message, data?}}`, where a
// rejection, an abort and a malformed reply fold into the error branch. Categories: bad-request, not-found,
// unavailable, cancelled, agent-busy, forbidden, internal (a carrier's `unauthorized` reads as forbidden, its
// `timeout` and `network` as unavailable, anything unknown as internal).
//
// Events. onRemoteEvent(name, handler) gets the `host/remote-event` frames `{name, args}` of that name ("*":
// every name), as handler(args, name). The host decides what it forwards (the eleven allowlisted core
// events); the client checks the payload's shape and the name against the same list and drops anything else
// with a console warning.

export const PARAM_TYPES = Object.freeze(["bool", "int64", "double", "string", "json", "session", "agent"]);
export const RESULT_TYPES = Object.freeze(["void", "bool", "int64", "double", "string", "json"]);
export const LOOKUPS = Object.freeze(["none", "session", "agent"]);
export const ERROR_CATEGORIES = Object.freeze([
  "bad-request",
  "not-found",
  "unavailable",
  "cancelled",
  "agent-busy",
  "forbidden",
  "internal",
]);
// The events the host forwards (DECISIONS.md "Event allowlist"; plugins/remote declares the same list).
export const FORWARDED_EVENTS = Object.freeze([
  "session.created",
  "session.closed",
  "session.status",
  "session.event",
  "subagent.started",
  "subagent.finished",
  "request.pending",
  "request.resolved",
  "plugin.mounted",
  "plugin.withdrawn",
  "host.config-changed",
]);
export const REMOTE_EVENT_FRAME = "host/remote-event";

const DESCRIPTOR_FIELDS = Object.freeze([
  "namespace",
  "method",
  "params",
  "result",
  "resultOptional",
  "cancellable",
  "lookup",
  "privileged",
  "plugin",
]);
const PARAM_FIELDS = Object.freeze(["name", "type", "optional"]);
const MAX_PARAMS = 16;
const MAX_JSON_DEPTH = 512;
const NAMESPACE_RE = /^[a-z][a-z0-9_-]{0,63}$/;
const NAME_RE = /^[a-z][A-Za-z0-9_]{0,63}$/;
// Service names that would change how the services object behaves (a thenable would be awaited).
const RESERVED_SERVICE_NAMES = Object.freeze(["then"]);
const CARRIER_CATEGORIES = Object.freeze({ unauthorized: "forbidden", timeout: "unavailable", network: "unavailable" });

// ---- errors -----------------------------------------------------------------------------------------------

// Thrown by transport.post when there is no connection to the host; invoke() passes it on.
export class NoConnectionError extends Error {
  constructor(message = "no connection to the host", options) {
    super(message, options);
    this.name = "NoConnectionError";
    this.noConnection = true;
  }
}

export function isNoConnection(err) {
  return err instanceof NoConnectionError || (err !== null && typeof err === "object" && err.noConnection === true);
}

// A refused mount or descriptor set. `code`: invalid-descriptor, duplicate-descriptor, namespace-taken,
// service-taken, install-failed; `path` names the offending field (e.g. "descriptors[3].params[0].type").
export class RemoteMountError extends Error {
  constructor(code, message, { path, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "RemoteMountError";
    this.code = code;
    if (path !== undefined) this.path = path;
  }
}

// ---- small checks -----------------------------------------------------------------------------------------

const isPlainObject = (v) => {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return false;
  const proto = Object.getPrototypeOf(v);
  return proto === Object.prototype || proto === null;
};
const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const wellFormed = (s) => (typeof s.isWellFormed === "function" ? s.isWellFormed() : !LONE_SURROGATE.test(s));
// A string the host takes: valid Unicode (JSON parsers refuse lone surrogates) without NUL.
const isHostString = (s) => typeof s === "string" && wellFormed(s) && !s.includes("\u0000");

// Null when V is a JSON value the host accepts, else why not (with the path below PATH).
function jsonProblem(v, path, depth = 0, ancestors = []) {
  if (depth > MAX_JSON_DEPTH) return `${path}: nested deeper than ${MAX_JSON_DEPTH} levels`;
  if (v === null || typeof v === "boolean") return null;
  if (typeof v === "number") return Number.isFinite(v) ? null : `${path}: ${v} is not a JSON number`;
  if (typeof v === "string") return isHostString(v) ? null : `${path}: a string with NUL or a lone surrogate`;
  if (typeof v !== "object") return `${path}: a ${typeof v} is not JSON`;
  if (ancestors.includes(v)) return `${path}: a cycle`;
  const next = [...ancestors, v];
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const why = jsonProblem(v[i], `${path}[${i}]`, depth + 1, next);
      if (why) return why;
    }
    return null;
  }
  if (!isPlainObject(v)) return `${path}: a ${v.constructor?.name ?? "non-plain"} object is not JSON`;
  if (Object.getOwnPropertySymbols(v).length) return `${path}: symbol keys are not JSON`;
  for (const k of Object.keys(v)) {
    if (!isHostString(k)) return `${path}: a key with NUL or a lone surrogate`;
    const why = jsonProblem(v[k], `${path}.${k}`, depth + 1, next);
    if (why) return why;
  }
  return null;
}

// ---- the descriptor codec ---------------------------------------------------------------------------------

function refuse(path, message) {
  throw new RemoteMountError("invalid-descriptor", `${path}: ${message}`, { path });
}

function exactFields(obj, fields, path) {
  if (!isPlainObject(obj)) refuse(path, "must be an object");
  for (const k of Object.keys(obj)) if (!fields.includes(k)) refuse(`${path}.${k}`, "unknown field");
  for (const k of fields) if (!hasOwn(obj, k)) refuse(`${path}.${k}`, "missing");
}

function decodeParam(raw, path, i, lookup) {
  exactFields(raw, PARAM_FIELDS, path);
  if (typeof raw.name !== "string" || !NAME_RE.test(raw.name)) refuse(`${path}.name`, "must match [a-z][A-Za-z0-9_]*");
  if (!PARAM_TYPES.includes(raw.type)) refuse(`${path}.type`, `must be one of ${PARAM_TYPES.join(", ")}`);
  if (typeof raw.optional !== "boolean") refuse(`${path}.optional`, "must be a boolean");
  if ((raw.type === "session" || raw.type === "agent") && (i !== 0 || raw.optional || raw.type !== lookup))
    refuse(`${path}.type`, `a ${raw.type} parameter must be the first one, required, and match the lookup`);
  return Object.freeze({ name: raw.name, type: raw.type, optional: raw.optional });
}

// One descriptor of remote.describe, checked field by field; returns a frozen copy or throws a
// RemoteMountError("invalid-descriptor") naming the field.
export function decodeDescriptor(raw, path = "descriptor") {
  exactFields(raw, DESCRIPTOR_FIELDS, path);
  if (typeof raw.namespace !== "string" || !NAMESPACE_RE.test(raw.namespace))
    refuse(`${path}.namespace`, "must match [a-z][a-z0-9_-]* (at most 64 characters)");
  if (typeof raw.method !== "string" || !NAME_RE.test(raw.method))
    refuse(`${path}.method`, "must match [a-z][A-Za-z0-9_]* (at most 64 characters)");
  if (!LOOKUPS.includes(raw.lookup)) refuse(`${path}.lookup`, `must be one of ${LOOKUPS.join(", ")}`);
  if (!Array.isArray(raw.params)) refuse(`${path}.params`, "must be an array");
  if (raw.params.length > MAX_PARAMS) refuse(`${path}.params`, `at most ${MAX_PARAMS} parameters`);
  const params = raw.params.map((p, i) => decodeParam(p, `${path}.params[${i}]`, i, raw.lookup));
  const names = new Set();
  params.forEach((p, i) => {
    if (names.has(p.name)) refuse(`${path}.params[${i}].name`, `duplicate parameter name "${p.name}"`);
    names.add(p.name);
  });
  if (raw.lookup !== "none" && params[0]?.type !== raw.lookup)
    refuse(`${path}.lookup`, `a ${raw.lookup} lookup needs a ${raw.lookup} as its first parameter`);
  if (!RESULT_TYPES.includes(raw.result)) refuse(`${path}.result`, `must be one of ${RESULT_TYPES.join(", ")}`);
  if (typeof raw.resultOptional !== "boolean") refuse(`${path}.resultOptional`, "must be a boolean");
  if (raw.resultOptional && raw.result !== "string" && raw.result !== "json")
    refuse(`${path}.resultOptional`, "only string and json results may be optional");
  for (const k of ["cancellable", "privileged"])
    if (typeof raw[k] !== "boolean") refuse(`${path}.${k}`, "must be a boolean");
  if (typeof raw.plugin !== "string" || !raw.plugin || !isHostString(raw.plugin))
    refuse(`${path}.plugin`, "must be a non-empty string");
  return Object.freeze({
    namespace: raw.namespace,
    method: raw.method,
    params: Object.freeze(params),
    result: raw.result,
    resultOptional: raw.resultOptional,
    cancellable: raw.cancellable,
    lookup: raw.lookup,
    privileged: raw.privileged,
    plugin: raw.plugin,
  });
}

// A descriptor set: `{descriptors: [...]}` (remote.describe's value) or the array itself. Every descriptor
// is decoded; the first failure refuses the whole set. Duplicates are the mount's business (mount()).
export function decodeDescriptorSet(raw) {
  let list = raw;
  const path = "descriptors";
  if (!Array.isArray(raw)) {
    exactFields(raw, ["descriptors"], "descriptorSet");
    list = raw.descriptors;
    if (!Array.isArray(list)) refuse("descriptorSet.descriptors", "must be an array");
  }
  return Object.freeze(list.map((d, i) => decodeDescriptor(d, `${path}[${i}]`)));
}

// ---- arguments and results --------------------------------------------------------------------------------

const TYPE_WORDS = {
  bool: "a boolean",
  int64: "an integer (a safe JS integer)",
  double: "a finite number",
  string: "a string without NUL",
  session: "a session id (string)",
  agent: "a session id (string)",
};

// Null when V fits TYPE, else what was expected.
function argProblem(type, v, path) {
  switch (type) {
    case "bool":
      return typeof v === "boolean" ? null : `${path}: expected ${TYPE_WORDS.bool}`;
    case "int64":
      return Number.isSafeInteger(v) ? null : `${path}: expected ${TYPE_WORDS.int64}`;
    case "double":
      return typeof v === "number" && Number.isFinite(v) ? null : `${path}: expected ${TYPE_WORDS.double}`;
    case "string":
      return isHostString(v) ? null : `${path}: expected ${TYPE_WORDS.string}`;
    case "session":
    case "agent":
      return isHostString(v) && v.length > 0 ? null : `${path}: expected ${TYPE_WORDS[type]}`;
    case "json":
      return v === undefined ? `${path}: expected a JSON value` : jsonProblem(v, path);
    default:
      return `${path}: unknown type ${type}`;
  }
}

// Positional ARGV → {args, options} or {problem}.
function encodeArgs(d, argv) {
  const np = d.params.length;
  const name = `${d.namespace}.${d.method}`;
  if (argv.length > np + 1)
    return { problem: `${name}: takes ${np} argument${np === 1 ? "" : "s"} and options, got ${argv.length}` };
  let options = {};
  if (argv.length === np + 1 && argv[np] !== undefined) {
    const o = argv[np];
    if (o === null || typeof o !== "object" || Object.keys(o).some((k) => k !== "signal"))
      return { problem: `${name}: argument ${np + 1} must be the options {signal} (${np} parameters)` };
    if (o.signal !== undefined && !(o.signal instanceof AbortSignal))
      return { problem: `options.signal: expected an AbortSignal` };
    options = o;
  }
  const args = {};
  for (let i = 0; i < np; i++) {
    const p = d.params[i];
    const v = argv[i];
    if (v === undefined || v === null) {
      if (p.optional) continue;
      return { problem: `args.${p.name}: missing (${p.type})` };
    }
    const why = argProblem(p.type, v, `args.${p.name}`);
    if (why) return { problem: why };
    args[p.name] = v;
  }
  return { args, options };
}

// Null when V is a valid value of D's result, else why not.
function resultProblem(d, v) {
  if (v === undefined) return "no value";
  if (d.result === "void") return v === null ? null : "expected null (void)";
  if (v === null && d.resultOptional) return null;
  switch (d.result) {
    case "bool":
      return typeof v === "boolean" ? null : "expected a boolean";
    case "int64":
      return Number.isSafeInteger(v) ? null : "expected an integer within ±(2^53 − 1)";
    case "double":
      return typeof v === "number" && Number.isFinite(v) ? null : "expected a finite number";
    case "string":
      return typeof v === "string" ? null : `expected a string${d.resultOptional ? " or null" : ""}`;
    case "json":
      return jsonProblem(v, "value");
    default:
      return `unknown result type ${d.result}`;
  }
}

function failure(category, message, data) {
  const error = { category, message };
  if (data !== undefined) error.data = data;
  return { ok: false, error };
}

// A rejection of transport.post as the error branch.
function foldRejection(err) {
  if (err !== null && typeof err === "object") {
    let cat = typeof err.category === "string" ? err.category : typeof err.code === "string" ? err.code : null;
    if (cat && !ERROR_CATEGORIES.includes(cat)) cat = CARRIER_CATEGORIES[cat] ?? (err.category ? "internal" : null);
    const message = typeof err.message === "string" && err.message ? err.message : "the call failed";
    if (cat) {
      const data = err.data !== undefined && jsonProblem(err.data, "data") === null ? err.data : undefined;
      return failure(cat, message, data);
    }
    if (err.name === "AbortError") return failure("cancelled", message);
    return failure("internal", message);
  }
  return failure("internal", `the call failed: ${String(err)}`);
}

// One signal that aborts when any of SIGNALS does: AbortSignal.any where the browser has it, else a
// controller fed by listeners, removed again by dispose().
export function mergeSignals(signals, { useAny = typeof AbortSignal.any === "function" } = {}) {
  const list = signals.filter(Boolean);
  if (list.length === 1) return { signal: list[0], dispose() {} };
  if (useAny) return { signal: AbortSignal.any(list), dispose() {} };
  const ctl = new AbortController();
  const already = list.find((s) => s.aborted);
  if (already) {
    ctl.abort(already.reason);
    return { signal: ctl.signal, dispose() {} };
  }
  const undo = [];
  const dispose = () => undo.splice(0).forEach((f) => f());
  for (const s of list) {
    const onAbort = () => {
      dispose();
      ctl.abort(s.reason);
    };
    s.addEventListener("abort", onAbort, { once: true });
    undo.push(() => s.removeEventListener("abort", onAbort));
  }
  return { signal: ctl.signal, dispose };
}

// ---- mounts -----------------------------------------------------------------------------------------------

class WithdrawnError extends Error {
  constructor() {
    super("the mount was withdrawn");
    this.name = "AbortError";
  }
}

export class RemoteMount {
  #client;
  #controller = new AbortController();
  #active = false;
  #installed = []; // namespaces, in install order
  #inflight = new Set();
  #unsubscribers = new Set();
  #settled = null;

  constructor(client, descriptors) {
    this.#client = client;
    this.descriptors = descriptors;
    this.namespaces = Object.freeze([...new Set(descriptors.map((d) => d.namespace))]);
  }

  get active() {
    return this.#active;
  }
  // The mount's lifetime: aborted by withdraw().
  get signal() {
    return this.#controller.signal;
  }
  // How many calls of this mount are in flight.
  get pending() {
    return this.#inflight.size;
  }

  // Installs every namespace (called once by RemoteClient.mount); undoes itself in reverse order on a failure.
  _install(target, owners) {
    const byNs = new Map();
    for (const d of this.descriptors) {
      if (!byNs.has(d.namespace)) byNs.set(d.namespace, []);
      byNs.get(d.namespace).push(d);
    }
    this.#active = true;
    try {
      for (const [ns, list] of byNs) {
        const service = Object.create(null);
        for (const d of list) {
          const fn = (...argv) => this.#call(d, argv);
          Object.defineProperty(fn, "name", { value: d.method });
          Object.defineProperty(fn, "descriptor", { value: d, enumerable: true });
          service[d.method] = Object.freeze(fn);
        }
        Object.freeze(service);
        if (!Reflect.defineProperty(target, ns, { value: service, enumerable: true, configurable: true, writable: false }))
          throw new TypeError(`the services object refused "${ns}"`);
        this.#installed.push(ns);
        owners.set(ns, this);
        if (target[ns] !== service) throw new TypeError(`the services object did not keep "${ns}"`);
      }
    } catch (err) {
      this.#active = false;
      this.#controller.abort(new WithdrawnError());
      const { removed, failed } = this.#uninstall(target, owners);
      throw new RemoteMountError(
        "install-failed",
        `installing the services failed (${err?.message ?? err}); ${removed} namespace(s) rolled back` +
          (failed ? `, ${failed} could not be removed` : ""),
        { cause: err },
      );
    }
  }

  // Removes the installed namespaces in reverse order; counts the removals that worked and failed.
  #uninstall(target, owners) {
    let removed = 0;
    let failed = 0;
    while (this.#installed.length) {
      const ns = this.#installed.pop();
      if (owners.get(ns) === this) owners.delete(ns);
      try {
        if (!Reflect.deleteProperty(target, ns)) throw new TypeError(`the services object kept "${ns}"`);
        removed++;
      } catch (err) {
        failed++;
        this.#client._log("error", `remote: cannot remove the service "${ns}":`, err);
      }
    }
    return { removed, failed };
  }

  // Calls NAMESPACE.METHOD with positional ARGV (the same as services.NAMESPACE.METHOD(...ARGV)).
  invoke(namespace, method, argv = [], options) {
    const d = this.descriptors.find((x) => x.namespace === namespace && x.method === method);
    if (!d) return Promise.resolve(failure("not-found", `${namespace}.${method}: not in this mount`));
    return this.#call(d, options === undefined ? argv : [...argv, ...Array(Math.max(0, d.params.length - argv.length)), options]);
  }

  // Subscribes like RemoteClient.onRemoteEvent; the subscription ends with the mount.
  onRemoteEvent(name, handler) {
    if (!this.#active) throw new Error("the mount was withdrawn");
    const off = this.#client.onRemoteEvent(name, handler);
    const unsubscribe = () => {
      if (this.#unsubscribers.delete(unsubscribe)) off();
    };
    this.#unsubscribers.add(unsubscribe);
    return unsubscribe;
  }

  // Marks the mount inactive, aborts its in-flight calls (they resolve "cancelled"), then removes its
  // methods and event subscriptions. Idempotent; resolves once every in-flight call has settled.
  withdraw() {
    if (this.#settled) return this.#settled;
    const wasActive = this.#active;
    this.#active = false;
    this.#controller.abort(new WithdrawnError());
    if (wasActive) this.#uninstall(this.#client._target, this.#client._owners);
    for (const off of [...this.#unsubscribers]) off();
    this.#settled = Promise.allSettled([...this.#inflight]).then(() => undefined);
    return this.#settled;
  }

  #call(d, argv) {
    const name = `${d.namespace}.${d.method}`;
    if (!this.#active) return Promise.resolve(failure("unavailable", `${name}: the mount was withdrawn`));
    const enc = encodeArgs(d, argv);
    if (enc.problem) return Promise.resolve(failure("bad-request", enc.problem));
    const merged = mergeSignals([enc.options.signal, this.#controller.signal]);
    const p = this.#send(d, name, enc.args, merged);
    this.#inflight.add(p);
    const done = () => {
      this.#inflight.delete(p);
      merged.dispose();
    };
    p.then(done, done);
    return p;
  }

  #cancelled(name) {
    return failure(
      "cancelled",
      this.#controller.signal.aborted ? `${name}: the mount was withdrawn` : `${name}: the call was aborted`,
    );
  }

  #send(d, name, args, { signal }) {
    if (signal.aborted) return Promise.resolve(this.#cancelled(name));
    return new Promise((resolve, reject) => {
      const onAbort = () => resolve(this.#cancelled(name));
      signal.addEventListener("abort", onAbort, { once: true });
      const finish = (f) => (x) => {
        signal.removeEventListener("abort", onAbort);
        f(x);
      };
      let sent;
      try {
        sent = this.#client._transport.post(
          "remote.invoke",
          { namespace: d.namespace, method: d.method, args },
          { signal },
        );
      } catch (err) {
        sent = Promise.reject(err);
      }
      Promise.resolve(sent).then(
        finish((value) => {
          if (signal.aborted) return resolve(this.#cancelled(name));
          const why = resultProblem(d, value);
          resolve(why ? failure("internal", `${name}: malformed reply: ${why}`) : { ok: true, value });
        }),
        finish((err) => {
          if (signal.aborted) return resolve(this.#cancelled(name));
          if (isNoConnection(err)) return reject(err);
          resolve(foldRejection(err));
        }),
      );
    });
  }
}

// ---- the client -------------------------------------------------------------------------------------------

export class RemoteClient {
  #handlers = new Map(); // event name or "*" → Set of handlers
  #unsubscribeFrames = null;
  #allowlist;

  // transport: see the top of this file. options.target: the object the services are published on (default
  // a fresh object without prototype, `client.services`); options.logger: console by default;
  // options.allowlist: the events delivered (default FORWARDED_EVENTS).
  constructor(transport, { target, logger = console, allowlist = FORWARDED_EVENTS } = {}) {
    if (!transport || typeof transport.post !== "function" || typeof transport.onEvent !== "function")
      throw new TypeError("a transport needs post(method, payload, {signal}) and onEvent(method, handler)");
    this._transport = transport;
    this._target = target ?? Object.create(null);
    this._owners = new Map(); // namespace → RemoteMount
    this._logger = logger;
    this.#allowlist = new Set(allowlist);
  }

  // The published services: services[namespace][method](...args, options?).
  get services() {
    return this._target;
  }

  // The namespaces mounted now, each with its mount.
  get mounts() {
    return new Map(this._owners);
  }

  _log(level, ...args) {
    try {
      (this._logger?.[level] ?? this._logger?.log)?.call(this._logger, ...args);
    } catch {
      // a logger that throws is not our problem
    }
  }

  // remote.describe through the transport, decoded by the strict codec: resolves with the frozen descriptor
  // array; rejects with the transport's error or a RemoteMountError("invalid-descriptor").
  async describe({ signal } = {}) {
    const value = await this._transport.post("remote.describe", {}, { signal });
    return decodeDescriptorSet(value);
  }

  // Mounts a descriptor set (see the top of this file); returns the RemoteMount or throws a
  // RemoteMountError, in which case nothing of the set is published.
  mount(descriptorSet) {
    const descriptors = decodeDescriptorSet(descriptorSet);
    const seen = new Set();
    descriptors.forEach((d, i) => {
      const key = `${d.namespace}.${d.method}`;
      if (seen.has(key))
        throw new RemoteMountError("duplicate-descriptor", `descriptors[${i}]: ${key} appears twice in the set`, {
          path: `descriptors[${i}]`,
        });
      seen.add(key);
    });
    const namespaces = [...new Set(descriptors.map((d) => d.namespace))];
    for (const ns of namespaces) {
      if (this._owners.has(ns))
        throw new RemoteMountError("namespace-taken", `namespace "${ns}" is mounted by another mount`, { path: ns });
    }
    for (const ns of namespaces) {
      if (RESERVED_SERVICE_NAMES.includes(ns) || ns in this._target)
        throw new RemoteMountError("service-taken", `the service name "${ns}" is already taken`, { path: ns });
    }
    const mount = new RemoteMount(this, descriptors);
    mount._install(this._target, this._owners);
    return mount;
  }

  // Calls handler(args, name) for each forwarded event NAME ("*": every name). Returns unsubscribe().
  onRemoteEvent(name, handler) {
    if (typeof handler !== "function") throw new TypeError("onRemoteEvent needs a handler function");
    if (name !== "*" && !this.#allowlist.has(name))
      throw new RangeError(`"${name}" is not a forwarded event (${[...this.#allowlist].join(", ")})`);
    if (!this.#handlers.has(name)) this.#handlers.set(name, new Set());
    const entry = { handler }; // one entry per subscription, so the same handler may subscribe twice
    this.#handlers.get(name).add(entry);
    if (!this.#unsubscribeFrames) {
      const off = this._transport.onEvent(REMOTE_EVENT_FRAME, (payload) => this.#onFrame(payload));
      this.#unsubscribeFrames = typeof off === "function" ? off : () => {};
    }
    let live = true;
    return () => {
      if (!live) return;
      live = false;
      const set = this.#handlers.get(name);
      set?.delete(entry);
      if (set && set.size === 0) this.#handlers.delete(name);
      if (this.#handlers.size === 0 && this.#unsubscribeFrames) {
        const off = this.#unsubscribeFrames;
        this.#unsubscribeFrames = null;
        off();
      }
    };
  }

  // One host/remote-event payload: {name, args}, nothing else.
  #onFrame(payload) {
    if (!isPlainObject(payload) || Object.keys(payload).some((k) => k !== "name" && k !== "args")) {
      this._log("warn", "remote: dropped a malformed host/remote-event frame (payload must be {name, args})");
      return;
    }
    const { name, args } = payload;
    if (typeof name !== "string" || !hasOwn(payload, "args") || args === undefined) {
      this._log("warn", "remote: dropped a malformed host/remote-event frame (needs a string name and args)");
      return;
    }
    if (!this.#allowlist.has(name)) {
      this._log("warn", `remote: dropped host/remote-event "${name}": not a forwarded event`);
      return;
    }
    const why = jsonProblem(args, "args");
    if (why) {
      this._log("warn", `remote: dropped host/remote-event "${name}": ${why}`);
      return;
    }
    const entries = [...(this.#handlers.get(name) ?? []), ...(this.#handlers.get("*") ?? [])];
    for (const { handler } of entries) {
      try {
        handler(args, name);
      } catch (err) {
        this._log("error", `remote: a handler of ${name} threw:`, err);
      }
    }
  }
}
