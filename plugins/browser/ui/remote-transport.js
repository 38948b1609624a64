// The UI's link to Remote (docs/protocols/remote.md): the transport remote.js needs, wired to the UI's API
// (api.js) and connection generations (connection.js), and the mount lifecycle per generation.
//
// - UiRemoteTransport.post(method, payload, {signal}) posts the client-request through Api.call (so an
//   ApiError rejects it: its `code` is read by remote.js). While no connection generation is ready it throws
//   remote.js's NoConnectionError without sending anything.
// - UiRemoteTransport.onEvent(method, handler) registers a handler for host-stream frames of METHOD; the UI's
//   sink passes each frame it gets to deliver() (the client subscribes to "host/remote-event" only).
// - RemoteLink runs one mount per ready generation (REMOTE-CLIENT-MOUNT): on ready, remote.describe and
//   mount(); when the generation ends (any connection state other than ready/degraded of that generation),
//   the mount is withdrawn, which aborts its in-flight calls (they resolve `cancelled`) and removes its
//   services. A plugin mounted or withdrawn during the generation makes it describe again; the set is
//   remounted only when it changed.
import { NoConnectionError, RemoteClient, isNoConnection } from "./remote.js";

export { NoConnectionError, isNoConnection };

const LIVE_STATES = new Set(["ready", "degraded"]);

export class UiRemoteTransport {
  // api: an Api (api.js). The link sets `generation` to the ready generation's number, or null.
  constructor(api) {
    this.api = api;
    this.generation = null;
    this.handlers = new Map(); // frame method → Set of handlers
  }

  post(method, payload, { signal } = {}) {
    if (this.generation === null) throw new NoConnectionError("not connected to the host");
    return this.api.call(method, payload, { signal });
  }

  onEvent(method, handler) {
    if (!this.handlers.has(method)) this.handlers.set(method, new Set());
    const entry = (payload) => handler(payload);
    this.handlers.get(method).add(entry);
    return () => {
      const set = this.handlers.get(method);
      set?.delete(entry);
      if (set && set.size === 0) this.handlers.delete(method);
    };
  }

  // A parsed downlink frame (connection.js parseFrame): handed to the handlers of its method. Returns true
  // when some handler took it.
  deliver(frame) {
    const set = this.handlers.get(frame.method);
    if (!set) return false;
    for (const h of [...set]) h(frame.payload);
    return true;
  }
}

export class RemoteLink {
  // api: the UI's Api; logger: console-like; onChange(link): called when the mount or its state changes;
  // onMount(mount, link): called after each new mount (subscribe to events with mount.onRemoteEvent, they
  // end with the mount).
  constructor({ api, logger = console, onChange = () => {}, onMount = () => {} }) {
    this.transport = new UiRemoteTransport(api);
    this.client = new RemoteClient(this.transport, { logger });
    this.logger = logger;
    this.onChange = onChange;
    this.onMount = onMount;
    this.mount = null;
    this.mountKey = null; // the mounted set, as JSON, to tell whether a new describe changed it
    this.state = "offline"; // offline | describing | mounted | unavailable
    this.problem = null; // why there is no mount (a message), when state is "unavailable"
    this.epoch = 0; // bumped by every (re)describe and every generation end: late answers are dropped
  }

  get services() {
    return this.client.services;
  }

  // The service function NS.METHOD of the current mount, or null.
  service(ns, method) {
    if (!this.mount?.active) return null;
    const svc = this.client.services[ns];
    return svc && typeof svc[method] === "function" ? svc[method] : null;
  }

  changed() {
    try {
      this.onChange(this);
    } catch (err) {
      this.logger.error("agenthost: a remote change handler failed", err);
    }
  }

  // The connection's state (connection.js setState): a generation that is no longer ready or degraded has
  // ended (or a newer one started) — its mount goes.
  connectionState(s) {
    if (this.transport.generation === null) return;
    if (LIVE_STATES.has(s.state) && s.generation === this.transport.generation) return;
    this.end(`generation ${this.transport.generation} ended (${s.state})`);
  }

  // A generation became ready (sink.onReady): describe and mount for it.
  ready(generation) {
    if (this.transport.generation !== null && this.transport.generation !== generation) this.end("a new generation");
    this.transport.generation = generation;
    return this.refresh();
  }

  // Ends the current generation's mount: in-flight calls resolve cancelled, the services go.
  end(reason) {
    this.epoch++;
    this.transport.generation = null;
    this.withdraw(reason);
    this.state = "offline";
    this.problem = null;
    this.changed();
  }

  withdraw(reason) {
    const m = this.mount;
    this.mount = null;
    this.mountKey = null;
    if (m) {
      this.logger.info?.(`agenthost: remote services withdrawn: ${reason}`);
      m.withdraw();
    }
  }

  // remote.describe for the current generation; (re)mounts when the set differs from the mounted one.
  async refresh() {
    const generation = this.transport.generation;
    if (generation === null) return;
    const epoch = ++this.epoch;
    if (!this.mount) {
      this.state = "describing";
      this.changed();
    }
    let set;
    try {
      set = await this.client.describe();
    } catch (err) {
      if (epoch !== this.epoch) return;
      if (isNoConnection(err)) return; // the generation ended meanwhile: end() said so
      this.withdraw("remote.describe failed");
      this.state = "unavailable";
      this.problem = `${err?.code ?? err?.category ?? "error"}: ${err?.message ?? err}`;
      this.logger.warn(`agenthost: remote services unavailable: ${this.problem}`);
      this.changed();
      return;
    }
    if (epoch !== this.epoch || generation !== this.transport.generation) return;
    const key = JSON.stringify(set);
    if (this.mount?.active && key === this.mountKey) return; // unchanged: the mount (and its calls) stay
    this.withdraw("the descriptor set changed");
    try {
      this.mount = this.client.mount(set);
      this.mountKey = key;
      this.state = "mounted";
      this.problem = null;
    } catch (err) {
      this.state = "unavailable";
      this.problem = `${err?.code ?? "error"}: ${err?.message ?? err}`;
      this.logger.warn(`agenthost: remote services not mounted: ${this.problem}`);
      this.changed();
      return;
    }
    try {
      this.onMount(this.mount, this);
    } catch (err) {
      this.logger.error("agenthost: a remote mount handler failed", err);
    }
    this.changed();
  }
}
