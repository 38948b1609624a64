// The UI's state: sessions, each session's stored events by seq, streamed text per turn, pending server
// requests and the mux cursor. Events are keyed by (sessionId, seq), so an event that arrives twice —
// replayed by the mux after a reconnect (`after=CURSOR`) and read again by session.history — is kept
// once; a hole in a session's seqs is visible (contiguousSeq) and filled from session.history.

const RECEIPT_SHOWN_MS = 6000;

export class Store {
  constructor() {
    this.sessions = new Map(); // id → session object (session.list / session.get shape)
    this.events = new Map(); // sessionId → Map(seq → stored event)
    this.streaming = new Map(); // sessionId → Map(turnId → text)
    this.reasoning = new Map(); // sessionId → Map(turnId → the model's streamed reasoning)
    this.progress = new Map(); // sessionId → Map(callId → "3/10: message") of running tools (session.progress)
    this.requests = new Map(); // id → {request, receipt?, resolvedState?, answering?}
    this.muxCursor = null; // the highest cursor seen on the mux stream
    this.pendingSummaries = new Map(); // sessionId → {approvals, questions, requests} (Remote sessions.pending)
    this.listeners = new Set();
    this.pending = null; // changes batched until the next microtask
  }

  subscribe(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  // Changes are batched per microtask: a burst of frames (a replay) renders once.
  changed(kind, sessionId = null) {
    if (!this.pending) {
      this.pending = { kinds: new Set(), sessions: new Set() };
      queueMicrotask(() => {
        const c = this.pending;
        this.pending = null;
        for (const fn of this.listeners) {
          try {
            fn(c);
          } catch (err) {
            console.error("agenthost: a view failed to update", err);
          }
        }
      });
    }
    this.pending.kinds.add(kind);
    if (sessionId) this.pending.sessions.add(sessionId);
  }

  // ---- sessions

  upsertSession(s) {
    if (!s || typeof s.id !== "string") return;
    const old = this.sessions.get(s.id);
    this.sessions.set(s.id, { ...old, ...s });
    this.changed("sessions", s.id);
  }

  setSessions(list) {
    for (const s of list) this.upsertSession(s);
  }

  setStatus(sessionId, status) {
    const s = this.sessions.get(sessionId);
    if (!s) return;
    if (s.status === status) return;
    this.sessions.set(sessionId, { ...s, status });
    if (status !== "running") {
      this.streaming.delete(sessionId);
      this.reasoning.delete(sessionId);
    }
    this.changed("sessions", sessionId);
    this.changed("events", sessionId);
  }

  markClosed(sessionId) {
    const s = this.sessions.get(sessionId);
    if (!s) return;
    this.sessions.set(sessionId, { ...s, closed: true, status: "closed" });
    this.changed("sessions", sessionId);
  }

  // A deleted session: gone with everything the tab kept of it.
  removeSession(sessionId) {
    if (!this.sessions.delete(sessionId)) return;
    this.events.delete(sessionId);
    this.streaming.delete(sessionId);
    this.reasoning.delete(sessionId);
    this.progress.delete(sessionId);
    this.pendingSummaries.delete(sessionId);
    this.changed("sessions", sessionId);
  }

  sortedSessions() {
    // Newest first (ids are UUIDv7, so they sort by creation time); subagent sessions after their roots.
    return [...this.sessions.values()].sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
  }

  // ---- events

  eventsOf(sessionId) {
    let m = this.events.get(sessionId);
    if (!m) {
      m = new Map();
      this.events.set(sessionId, m);
    }
    return m;
  }

  // Adds a stored event; returns true when it is new. CURSOR (when from the mux) advances the resume point.
  addEvent(sessionId, ev, { cursor = null } = {}) {
    if (cursor !== null && (this.muxCursor === null || cursor > this.muxCursor)) this.muxCursor = cursor;
    const m = this.eventsOf(sessionId);
    if (m.has(ev.seq)) return false;
    m.set(ev.seq, ev);
    const s = this.sessions.get(sessionId);
    if (s && !(s.lastSeq >= ev.seq)) this.sessions.set(sessionId, { ...s, lastSeq: ev.seq });
    // Committed text replaces what was streamed for the turn; a turn's end drops any leftover.
    if ((ev.kind === "message/committed" || ev.kind === "turn/ended") && ev.turnId) {
      this.streaming.get(sessionId)?.delete(ev.turnId);
    }
    if (ev.kind === "turn/ended" && ev.turnId) this.reasoning.get(sessionId)?.delete(ev.turnId);
    if (ev.kind === "tool/result") this.progress.get(sessionId)?.delete(ev.data?.callId);
    if (ev.kind === "turn/ended") this.progress.delete(sessionId);
    this.changed("events", sessionId);
    return true;
  }

  sortedEvents(sessionId) {
    return [...this.eventsOf(sessionId).values()].sort((a, b) => a.seq - b.seq);
  }

  // The largest N such that seqs 1..N are all present (0 when seq 1 is missing).
  contiguousSeq(sessionId) {
    const m = this.eventsOf(sessionId);
    let n = 0;
    while (m.has(n + 1)) n++;
    return n;
  }

  // True when the events known for the session have a hole, or end before the session's lastSeq.
  hasGap(sessionId) {
    const m = this.eventsOf(sessionId);
    const n = this.contiguousSeq(sessionId);
    if (m.size !== n) return true;
    const last = this.sessions.get(sessionId)?.lastSeq;
    return typeof last === "number" && last > n;
  }

  addDelta(sessionId, turnId, text) {
    let m = this.streaming.get(sessionId);
    if (!m) {
      m = new Map();
      this.streaming.set(sessionId, m);
    }
    const key = turnId ?? "";
    m.set(key, (m.get(key) ?? "") + text);
    this.changed("events", sessionId);
  }

  streamingOf(sessionId) {
    return [...(this.streaming.get(sessionId)?.entries() ?? [])];
  }

  // The model's reasoning streams beside its answer (session.reasoning): shown while the turn runs, never
  // stored.
  addReasoning(sessionId, turnId, text) {
    let m = this.reasoning.get(sessionId);
    if (!m) {
      m = new Map();
      this.reasoning.set(sessionId, m);
    }
    const key = turnId ?? "";
    m.set(key, (m.get(key) ?? "") + text);
    this.changed("events", sessionId);
  }

  // A running tool's progress: shown on its call until its result arrives, never stored.
  addProgress(sessionId, p) {
    let m = this.progress.get(sessionId);
    if (!m) {
      m = new Map();
      this.progress.set(sessionId, m);
    }
    const total = typeof p.total === "number" ? `/${p.total}` : "";
    m.set(p.callId, `${p.progress}${total}${typeof p.message === "string" && p.message ? `: ${p.message}` : ""}`);
    this.changed("events", sessionId);
  }

  reasoningOf(sessionId, turnId) {
    return this.reasoning.get(sessionId)?.get(turnId ?? "") ?? "";
  }

  // ---- server requests

  addRequest(req) {
    const old = this.requests.get(req.id);
    if (old && old.resolvedState) return;
    this.requests.set(req.id, { ...old, request: req });
    this.changed("requests", req.sessionId);
  }

  // Drops pending requests the host no longer knows (after a reconnect, from request.list).
  keepRequests(ids) {
    const keep = new Set(ids);
    for (const [id, r] of this.requests) {
      if (!keep.has(id) && !r.resolvedState && !r.receipt) {
        this.requests.delete(id);
        this.changed("requests", r.request.sessionId);
      }
    }
  }

  // Another tab (or the host) resolved the request: its card goes. A card that shows a refused receipt
  // (this tab answered late) stays a few seconds so the user can read it.
  resolveRequest(id, state) {
    const r = this.requests.get(id);
    if (!r) return;
    r.resolvedState = state ?? "resolved";
    if (r.receipt && !r.receipt.accepted) {
      this.changed("requests", r.request.sessionId);
      return;
    }
    this.dropRequest(id);
  }

  dropRequest(id) {
    const r = this.requests.get(id);
    if (!r) return;
    this.requests.delete(id);
    this.changed("requests", r.request.sessionId);
  }

  setAnswering(id, answering) {
    const r = this.requests.get(id);
    if (!r) return;
    r.answering = answering;
    this.changed("requests", r.request.sessionId);
  }

  setReceipt(id, receipt) {
    const r = this.requests.get(id);
    if (!r) return;
    r.receipt = receipt;
    r.answering = false;
    this.changed("requests", r.request.sessionId);
    if (receipt.accepted) {
      this.dropRequest(id); // this answer resolved it
    } else {
      setTimeout(() => this.dropRequest(id), RECEIPT_SHOWN_MS);
    }
  }

  pendingRequests() {
    return [...this.requests.values()];
  }

  // ---- pending-request summaries (Remote sessions.pending)

  setPendingSummary(sessionId, summary) {
    if (summary) this.pendingSummaries.set(sessionId, summary);
    else this.pendingSummaries.delete(sessionId);
    this.changed("pending", sessionId);
  }

  // How many requests of SESSIONID wait for an answer: the host's summary when there is one, else null.
  pendingCount(sessionId) {
    const s = this.pendingSummaries.get(sessionId);
    return s ? s.requests.length : null;
  }
}
