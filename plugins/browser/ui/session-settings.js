// The selected session's settings, all through Remote (remote.js, namespace `sessions`; never the plain
// session.* methods): rename (inline edit: Enter saves, Escape cancels), tags (comma-separated), the
// run_command tool policy (allow / ask / deny), and the pending-request badge from sessions.pending,
// refreshed on the forwarded request.pending / request.resolved events. A `{ok:false, error}` result is
// shown inline as "CATEGORY: MESSAGE" next to the control that made the call.
import { isNoConnection } from "./remote-transport.js";
import { pendingTitle } from "./views.js";

const $ = (id) => document.getElementById(id);
const POLICY_TOOL = "run_command";
const POLICY_DEFAULT = "ask"; // the host's default for run_command (a session without its own policy)
const STATUS_SHOWN_MS = 4000;

export function errorText(error) {
  return `${error?.category ?? "internal"}: ${error?.message ?? "the call failed"}`;
}

// "a, b ,, c, a" → ["a", "b", "c"]
export function parseTags(text) {
  return [...new Set(String(text).split(",").map((t) => t.trim()).filter(Boolean))];
}

export class SessionSettings {
  // store: the UI's Store; link: a RemoteLink; getSelected(): the selected session id or null.
  constructor({ store, link, getSelected, logger = console }) {
    this.store = store;
    this.link = link;
    this.getSelected = getSelected;
    this.logger = logger;
    this.shownFor = null; // the session the controls were last filled for
    this.tagsDirty = false;
    this.busy = { rename: false, tags: false, policy: false };
    this.pendingLoads = new Map(); // sessionId → {running, again}
    this.statusTimer = null;
    this.wire();
  }

  // ---- calls

  // NS.METHOD(...ARGS) on the current mount → a RemoteResult. No mount or no connection reads as an
  // `unavailable` result, so the caller shows it like any other error.
  async call(method, args) {
    const fn = this.link.service("sessions", method);
    if (!fn) {
      const why =
        this.link.state === "unavailable"
          ? this.link.problem
          : this.link.state === "describing"
            ? "the remote services are being loaded"
            : "not connected to the host";
      return { ok: false, error: { category: "unavailable", message: `sessions.${method}: ${why}` } };
    }
    try {
      return await fn(...args);
    } catch (err) {
      if (isNoConnection(err)) return { ok: false, error: { category: "unavailable", message: `sessions.${method}: not connected to the host` } };
      throw err;
    }
  }

  // ---- wiring

  wire() {
    $("rename").addEventListener("click", () => this.openRename());
    $("rename-cancel").addEventListener("click", () => this.closeRename());
    $("rename-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.saveRename();
    });
    $("rename-input").addEventListener("keydown", (e) => {
      if (e.key === "Escape") {
        e.preventDefault();
        e.stopPropagation();
        this.closeRename();
      }
    });
    $("tags-form").addEventListener("submit", (e) => {
      e.preventDefault();
      this.saveTags();
    });
    $("tags-input").addEventListener("input", () => {
      this.tagsDirty = true;
    });
    $("tags-input").addEventListener("keydown", (e) => {
      if (e.key === "Escape" && this.tagsDirty) {
        e.preventDefault();
        this.tagsDirty = false;
        this.fillTags(true);
        this.setError("");
      }
    });
    $(`policy-${POLICY_TOOL}`).addEventListener("change", () => this.savePolicy());
  }

  // The selected session changed: drop edits and messages of the previous one.
  select(id) {
    if (id === this.shownFor) return;
    this.shownFor = id;
    this.tagsDirty = false;
    this.closeRename({ focus: false });
    this.setError("");
    this.setStatus("");
    this.fillTags(true);
    this.fillPolicy();
    if (id) this.refreshPendingIfLive(id);
  }

  session() {
    const id = this.getSelected();
    return id ? this.store.sessions.get(id) : null;
  }

  // ---- rendering (called from the UI's renderAll)

  render() {
    const id = this.getSelected();
    if (id !== this.shownFor) this.select(id);
    if (!id) return;
    const s = this.session();
    const mounted = this.link.state === "mounted";
    const closed = Boolean(s?.closed);
    const has = (m) => mounted && Boolean(this.link.service("sessions", m));
    $("rename").disabled = !has("rename") || closed;
    $("tags-input").disabled = !has("set_tags") || closed || this.busy.tags;
    $("tags-save").disabled = !has("set_tags") || closed || this.busy.tags;
    const sel = $(`policy-${POLICY_TOOL}`);
    sel.disabled = !has("tool_policy") || closed || this.busy.policy;
    const box = $("session-settings");
    box.dataset.remote = this.link.state;
    if (this.link.state === "unavailable" && this.store.pendingSummaries.size) {
      // No sessions.pending to keep them fresh: the list falls back to the requests this tab holds.
      for (const sid of [...this.store.pendingSummaries.keys()]) this.store.setPendingSummary(sid, null);
    }
    const note = $("settings-note");
    const noteText = closed
      ? "The session is closed."
      : this.link.state === "unavailable"
        ? `Session settings are unavailable (${this.link.problem}).`
        : mounted
          ? ""
          : "Session settings are available once connected.";
    if (note.textContent !== noteText) note.textContent = noteText;
    note.hidden = !noteText;
    this.fillTags(false);
    this.fillPolicy();
    this.renderPending(id);
  }

  renderPending(id) {
    const badge = $("session-pending");
    const summary = this.store.pendingSummaries.get(id);
    if (!summary) {
      badge.hidden = true;
      delete badge.dataset.pending;
      return;
    }
    const n = summary.requests.length;
    badge.hidden = false;
    badge.dataset.pending = String(n);
    badge.textContent = `${n} pending`;
    badge.title = pendingTitle(summary);
    badge.classList.toggle("badge-attn", n > 0);
  }

  fillTags(force) {
    const input = $("tags-input");
    if (!force && (this.tagsDirty || this.busy.tags)) return;
    const tags = Array.isArray(this.session()?.tags) ? this.session().tags : [];
    const text = tags.join(", ");
    if (input.value !== text) input.value = text;
  }

  fillPolicy() {
    if (this.busy.policy) return;
    const sel = $(`policy-${POLICY_TOOL}`);
    const p = this.session()?.policy?.[POLICY_TOOL];
    const v = p === "allow" || p === "ask" || p === "deny" ? p : POLICY_DEFAULT;
    if (sel.value !== v) sel.value = v;
  }

  setError(text, field = "settings") {
    const node = $(field === "rename" ? "rename-error" : "settings-error");
    if (node.textContent !== text) node.textContent = text;
    node.hidden = !text;
  }

  setStatus(text) {
    const node = $("settings-status");
    node.textContent = text;
    clearTimeout(this.statusTimer);
    if (text) this.statusTimer = setTimeout(() => (node.textContent = ""), STATUS_SHOWN_MS);
  }

  // ---- rename

  openRename() {
    const s = this.session();
    if (!s || $("rename").disabled) return;
    $("rename-input").value = s.title ?? "";
    this.setError("", "rename");
    $("rename-form").hidden = false;
    $("rename").hidden = true;
    $("rename-input").focus();
    $("rename-input").select();
  }

  closeRename({ focus = true } = {}) {
    const wasOpen = !$("rename-form").hidden;
    $("rename-form").hidden = true;
    $("rename").hidden = false;
    this.setError("", "rename");
    if (focus && wasOpen) $("rename").focus();
  }

  setRenameBusy(busy) {
    this.busy.rename = busy;
    for (const n of $("rename-form").querySelectorAll("input, button")) n.disabled = busy;
  }

  async saveRename() {
    const id = this.getSelected();
    if (!id || this.busy.rename) return;
    const title = $("rename-input").value.trim();
    this.setRenameBusy(true);
    let r;
    try {
      r = await this.call("rename", [id, title]);
    } finally {
      this.setRenameBusy(false);
    }
    if (id !== this.getSelected()) return;
    if (r.ok) {
      this.store.upsertSession({ id, title });
      this.closeRename();
      this.setStatus("Renamed.");
    } else {
      this.setError(errorText(r.error), "rename");
      $("rename-input").focus();
    }
  }

  // ---- tags

  async saveTags() {
    const id = this.getSelected();
    if (!id || this.busy.tags) return;
    const tags = parseTags($("tags-input").value);
    this.busy.tags = true;
    this.setError("");
    this.render();
    let r;
    try {
      r = await this.call("set_tags", [id, tags]);
    } finally {
      this.busy.tags = false;
    }
    if (id !== this.getSelected()) return this.render();
    if (r.ok) {
      this.tagsDirty = false;
      this.store.upsertSession({ id, tags: Array.isArray(r.value) ? r.value : tags });
      this.setStatus(tags.length ? "Tags saved." : "Tags cleared.");
    } else {
      this.setError(`Tags not saved — ${errorText(r.error)}`);
    }
    this.render();
    $("tags-input").focus();
  }

  // ---- tool policy

  async savePolicy() {
    const id = this.getSelected();
    const sel = $(`policy-${POLICY_TOOL}`);
    const policy = sel.value;
    if (!id || this.busy.policy) return;
    this.busy.policy = true;
    this.setError("");
    this.render();
    let r;
    try {
      r = await this.call("tool_policy", [id, POLICY_TOOL, policy]);
    } finally {
      this.busy.policy = false;
    }
    if (id === this.getSelected()) {
      if (r.ok) {
        this.store.upsertSession({ id, policy: r.value && typeof r.value === "object" ? r.value : { [POLICY_TOOL]: policy } });
        this.setStatus(`${POLICY_TOOL}: ${policy}`);
      } else {
        this.setError(`Policy not changed — ${errorText(r.error)}`);
      }
    }
    this.render(); // the select shows the session's policy again (the old one after a failure)
    if (id === this.getSelected()) sel.focus();
  }

  // ---- pending requests (sessions.pending)

  // A new mount: its event subscriptions (they end with the mount), then the summaries the UI shows.
  onMount(mount) {
    mount.onRemoteEvent("request.pending", (args) => this.refreshPending(args?.request?.sessionId));
    mount.onRemoteEvent("request.resolved", (args) => this.refreshPending(args?.sessionId));
    mount.onRemoteEvent("session.closed", (args) => {
      if (typeof args?.sessionId === "string") this.store.setPendingSummary(args.sessionId, null);
    });
    this.refreshKnown();
  }

  // Every session whose summary the UI shows or whose requests it holds, and the selected one.
  refreshKnown() {
    const ids = new Set(this.store.pendingSummaries.keys());
    for (const r of this.store.pendingRequests()) ids.add(r.request.sessionId);
    const sel = this.getSelected();
    for (const id of ids) this.refreshPending(id);
    if (sel && !ids.has(sel)) this.refreshPendingIfLive(sel);
  }

  // sessions.pending resumes a cold session (a lookup), and a cold session has no pending request: ask
  // only for sessions the host holds live.
  refreshPendingIfLive(id) {
    const s = this.store.sessions.get(id);
    if (s && (s.closed || s.live === false)) return;
    this.refreshPending(id);
  }

  refreshPending(id) {
    if (typeof id !== "string" || !id) return;
    let h = this.pendingLoads.get(id);
    if (h?.running) {
      h.again = true;
      return;
    }
    h = { running: true, again: false };
    this.pendingLoads.set(id, h);
    (async () => {
      try {
        do {
          h.again = false;
          if (!this.link.service("sessions", "pending")) break;
          const r = await this.call("pending", [id]);
          if (r.ok) {
            const v = r.value;
            const ok = v && Array.isArray(v.requests) && Number.isSafeInteger(v.approvals) && Number.isSafeInteger(v.questions);
            if (ok) this.store.setPendingSummary(id, v);
            else this.logger.warn(`agenthost: sessions.pending of ${id}: unexpected value`);
          } else if (r.error.category === "not-found") {
            this.store.setPendingSummary(id, null);
          } else if (r.error.category !== "cancelled") {
            this.logger.warn(`agenthost: sessions.pending of ${id}: ${errorText(r.error)}`);
          }
        } while (h.again);
      } catch (err) {
        this.logger.warn(`agenthost: sessions.pending of ${id} failed: ${err?.message ?? err}`);
      } finally {
        h.running = false;
      }
    })();
  }
}
