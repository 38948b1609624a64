// The agenthost web UI: wires the API, the connection loop, the store and the views together.
import { Api, ApiError, storeToken, takeToken } from "./api.js";
import { Connection } from "./connection.js";
import { Recorder } from "./recorder.js";
import { UsagePanel } from "./usage.js";
import { RemoteLink } from "./remote-transport.js";
import { SessionSettings } from "./session-settings.js";
import { Store } from "./store.js";
import { ConversationView, el, renderConnection, renderRequests, renderSessionList, sessionLabel } from "./views.js";

const $ = (id) => document.getElementById(id);
const CWD_KEY = "agenthost.lastCwd";

const recorder = new Recorder();
const api = new Api({ token: takeToken(), recorder });
const store = new Store();
const conversation = new ConversationView($("conversation"), $("conversation-scroll"));
let selected = new URLSearchParams(location.hash.slice(1)).get("s");
let connState = { state: "idle" };

// A small log of what the UI dropped or failed at, for diagnosis from the console (agenthostLog()).
const logRing = [];
const logger = {
  add(level, args) {
    logRing.push({ time: new Date().toISOString(), level, text: args.map((a) => (a instanceof Error ? a.message : String(a))).join(" ") });
    if (logRing.length > 200) logRing.shift();
  },
  info: (...a) => (logger.add("info", a), console.info(...a)),
  warn: (...a) => (logger.add("warn", a), console.warn(...a)),
  error: (...a) => (logger.add("error", a), console.error(...a)),
};
window.agenthostLog = () => logRing.slice();

// Remote (remote.js through remote-transport.js): one mount per ready connection generation; the
// session settings (rename, tags, tool policy, pending summary) call its `sessions` services.
const remote = new RemoteLink({
  api,
  logger,
  onChange: () => renderAll(),
  onMount: (mount) => settings.onMount(mount),
});
const settings = new SessionSettings({ store, link: remote, getSelected: () => selected, logger });
// For diagnosis from the console (and the end-to-end tests): the link's state and mounted namespaces.
window.agenthostRemote = () => ({
  state: remote.state,
  generation: remote.transport.generation,
  problem: remote.problem,
  namespaces: remote.mount ? [...remote.mount.namespaces] : [],
});

function notice(text, { error = false } = {}) {
  const n = $("notice");
  n.textContent = text;
  n.dataset.kind = error ? "error" : "info";
  n.hidden = !text;
  clearTimeout(notice.timer);
  if (text) notice.timer = setTimeout(() => (n.hidden = true), error ? 10000 : 4000);
}

function describeError(err) {
  if (err instanceof ApiError) return `${err.message} (${err.code}${err.correlationId ? `, id ${err.correlationId}` : ""})`;
  return String(err?.message ?? err);
}

// ---- loading from the host

const historyLoads = new Map(); // sessionId → {running, again}

// Reads the session's history after the last seq held without a hole; merged by seq, so it never
// duplicates what the mux delivers, and fills what a disconnect missed.
function ensureHistory(sessionId) {
  let h = historyLoads.get(sessionId);
  if (h?.running) {
    h.again = true;
    return;
  }
  h = { running: true, again: false };
  historyLoads.set(sessionId, h);
  (async () => {
    try {
      do {
        h.again = false;
        let afterSeq = store.contiguousSeq(sessionId);
        for (let page = 0; page < 1000; page++) {
          const r = await api.call("session.history", { sessionId, afterSeq, limit: 1000 });
          for (const ev of r.events ?? []) store.addEvent(sessionId, ev);
          if (r.nextAfterSeq === null || r.nextAfterSeq === undefined || !(r.events?.length > 0)) break;
          afterSeq = r.nextAfterSeq;
        }
      } while (h.again);
    } catch (err) {
      logger.warn(`agenthost: history of ${sessionId} not loaded: ${describeError(err)}`);
    } finally {
      h.running = false;
    }
  })();
}

async function loadSessions() {
  let cursor = null;
  for (let page = 0; page < 100; page++) {
    const r = await api.call("session.list", cursor ? { cursor, limit: 500 } : { limit: 500 });
    store.setSessions(r.sessions ?? []);
    if (!r.nextCursor) break;
    cursor = r.nextCursor;
  }
}

async function loadRequests() {
  const r = await api.call("request.list", {});
  const list = r.requests ?? [];
  for (const req of list) store.addRequest(req);
  store.keepRequests(list.map((q) => q.id));
}

const fetchingSession = new Set();
async function fetchSession(sessionId) {
  if (fetchingSession.has(sessionId)) return;
  fetchingSession.add(sessionId);
  try {
    const r = await api.call("session.get", { sessionId });
    if (r?.session) store.upsertSession(r.session);
  } catch (err) {
    logger.warn(`agenthost: session ${sessionId}: ${describeError(err)}`);
    if (err instanceof ApiError && err.code === "not-found" && sessionId === selected) {
      // A stale link (#s=ID) to a session this host does not have.
      selected = null;
      history.replaceState(history.state, "", location.pathname + location.search);
      notice("That session does not exist on this host.", { error: true });
      renderAll();
    }
  } finally {
    fetchingSession.delete(sessionId);
  }
}

// ---- the downlink sink

function requestOf(frame) {
  const p = frame.payload;
  const r = p && typeof p.request === "object" && p.request ? { ...p.request } : { ...p };
  r.id ??= frame.rpcId;
  r.kind ??= frame.method === "request.question" ? "question" : "approval";
  return r;
}

let remoteRefreshTimer = null;

function onFrame(frame) {
  const p = frame.payload;
  // host/remote-event frames go to the Remote client's subscriptions.
  if (remote.transport.deliver(frame)) return;
  switch (frame.method) {
    case "session.event": {
      if (!store.sessions.has(p.sessionId)) fetchSession(p.sessionId);
      store.addEvent(p.sessionId, p.event, { cursor: frame.cursor });
      if (p.sessionId === selected && store.hasGap(p.sessionId)) ensureHistory(p.sessionId);
      break;
    }
    case "session.delta":
      store.addDelta(p.sessionId, p.turnId ?? p.messageId ?? null, p.text);
      break;
    case "session.reasoning":
      store.addReasoning(p.sessionId, p.turnId ?? p.messageId ?? null, p.text);
      break;
    case "session.status":
      if (!store.sessions.has(p.sessionId)) fetchSession(p.sessionId);
      store.setStatus(p.sessionId, p.status);
      break;
    case "session.created":
      store.upsertSession(p.session);
      break;
    case "session.closed":
      store.markClosed(p.sessionId);
      break;
    case "session.updated": // a rename or new tags, from this tab or another surface
      if (store.sessions.has(p.sessionId)) {
        const { sessionId, ...fields } = p;
        store.upsertSession({ ...fields, id: sessionId });
      }
      break;
    case "session.deleted":
      store.removeSession(p.sessionId);
      if (p.sessionId === selected) {
        selected = null;
        history.replaceState(history.state, "", location.pathname + location.search);
        notice("The session was deleted.");
        renderAll();
      }
      break;
    case "request.approval":
    case "request.question":
      store.addRequest(requestOf(frame));
      break;
    case "request.resolved":
      store.resolveRequest(p.id, p.state);
      break;
    case "stream/error":
      logger.warn("agenthost: stream error", JSON.stringify(p));
      notice(`The host reported a stream error: ${p?.message ?? p?.error?.message ?? "unknown"}`, { error: true });
      break;
    case "session.progress":
      store.addProgress(p.sessionId, p);
      break;
    case "tools.changed":
      if (!p.sessionId || p.sessionId === selected) loadTools();
      break;
    case "plugin.mounted":
    case "plugin.withdrawn":
      // The descriptor set may have changed: describe again (remounted only if it did).
      clearTimeout(remoteRefreshTimer);
      remoteRefreshTimer = setTimeout(() => remote.refresh(), 100);
      break;
    default:
      // Unknown methods pass through unhandled.
      break;
  }
}

// The new-session form's provider choice (provider.list): the configured providers with their models; the
// default is selected. A provider whose plugin is not mounted is listed, disabled.
let providers = [];

function showModels() {
  const p = providers.find((x) => x.name === $("new-provider").value);
  const list = $("new-models");
  list.replaceChildren(...(p?.models ?? []).map((m) => el("option", { value: m })));
  $("new-model").placeholder = p?.model ?? "the provider's default";
}

async function loadProviders() {
  const r = await api.call("provider.list", {});
  providers = Array.isArray(r?.providers) ? r.providers : [];
  const sel = $("new-provider");
  const keep = sel.value;
  sel.replaceChildren(
    ...providers.map((p) =>
      el("option", { value: p.name, selected: keep ? p.name === keep : p.default, disabled: !p.available },
        `${p.name}${p.type && p.type !== p.name ? ` (${p.type})` : ""}${p.available ? "" : " — unavailable"}`),
    ),
  );
  showModels();
}

$("new-provider").addEventListener("change", showModels);

// The tools the selected session's next turn would offer (session.tools), by server: the built-in ones, the
// plugins' and each MCP server's (its `group`), each with the policy that applies. Asked when the panel is
// opened (asking starts host-wide MCP servers, as a turn would) and again on tools.changed while it is open.
let toolsFor = null;

async function loadTools() {
  const panel = $("tools-panel");
  if (!panel.open || !selected) return;
  const id = selected;
  let r;
  try {
    r = await api.call("session.tools", { sessionId: id });
  } catch (err) {
    if (id !== selected) return;
    $("tools-list").replaceChildren(el("p", { class: "field-error", text: `Tools: ${describeError(err)}` }));
    return;
  }
  if (id !== selected) return;
  toolsFor = id;
  const tools = Array.isArray(r?.tools) ? r.tools : [];
  const groups = new Map();
  for (const t of tools) {
    const g = typeof t.group === "string" ? `MCP server ${t.group}` : t.params ? "Built-in" : "Plugins";
    if (!groups.has(g)) groups.set(g, []);
    groups.get(g).push(t);
  }
  $("tools-summary").textContent = `Tools (${tools.length})`;
  $("tools-list").replaceChildren(
    ...[...groups].map(([g, list]) =>
      el("section", { class: "tools-group", dataset: { group: g } },
        el("h4", { text: `${g} · ${list.length}` }),
        el("ul", {},
          ...list.map((t) =>
            el("li", { dataset: { tool: t.name } },
              el("code", { text: t.name }), " ",
              el("span", { class: `badge policy-${t.policy}`, text: t.policy }), " ",
              el("span", { class: "tool-desc", text: String(t.description ?? "").split("\n")[0].slice(0, 160) }))))),
    ),
  );
  const notes = Array.isArray(r?.notices) ? r.notices : [];
  $("tools-notices").hidden = notes.length === 0;
  $("tools-notices").textContent = notes.join(" · ");
}

$("tools-panel").addEventListener("toggle", () => loadTools());

async function onReady(info) {
  $("token-banner").hidden = true;
  const mounted = remote.ready(info.generation);
  try {
    await Promise.all([loadSessions(), loadRequests(), loadProviders()]);
  } catch (err) {
    logger.warn(`agenthost: refresh after connecting failed: ${describeError(err)}`);
  }
  if (selected) ensureHistory(selected);
  await mounted;
  settings.refreshKnown(); // with the sessions and requests of this generation loaded
}

function onState(s) {
  connState = s;
  remote.connectionState(s);
  renderConnection($("conn"), s);
  if (s.state === "unauthorized") showTokenBanner("The host refused the access token. Open the launch URL again (“agenthost url” prints it).");
}

const connection = new Connection({ api, getAfter: () => store.muxCursor, sink: { onFrame, onReady, onState }, logger, recorder });

setInterval(() => {
  if (connState.state === "waiting" || connState.state === "unauthorized") renderConnection($("conn"), connState);
}, 1000);

// ---- rendering

function sessionName(id) {
  const s = store.sessions.get(id);
  return s ? sessionLabel(s) : `session ${id.slice(-8)}`;
}

// CHANGE (from the store) says what changed; without it everything is drawn again.
function renderAll(change = null) {
  const touches = (kind) => !change || change.kinds.has(kind);
  if (touches("sessions") || touches("requests") || touches("pending"))
    renderSessionList($("session-list"), store, selected, select);
  const s = selected ? store.sessions.get(selected) : null;
  $("empty").hidden = Boolean(selected);
  $("session-view").hidden = !selected;
  if (selected) {
    conversation.show(selected);
    if (!change || change.sessions.has(selected) || !change.sessions.size) conversation.update(store);
    $("session-title").textContent = s ? sessionLabel(s) : `session ${selected.slice(-8)}`;
    const status = s ? (s.closed ? "closed" : s.status ?? "idle") : "…";
    const st = $("session-status");
    st.textContent = status;
    st.className = `badge status-${status}`;
    $("session-cwd").textContent = s?.cwd ?? "";
    $("cancel").disabled = status !== "running";
    $("send").disabled = Boolean(s?.closed);
    $("prompt").disabled = Boolean(s?.closed);
  }
  settings.render();
  if (selected) {
    // the host's totals are asked again whenever a turn of the shown session ended
    const ended = usage.endedTurns(selected);
    if (usageSeen.get(selected) !== ended) {
      usageSeen.set(selected, ended);
      refreshUsage();
    }
    usage.render();
  }
  if (touches("requests") || touches("sessions"))
    renderRequests($("requests"), store, { selectedId: selected, sessionName, onAnswer: answer, onOpen: select });
}

store.subscribe((change) => renderAll(change));

function select(id) {
  selected = id;
  if (toolsFor !== id) {
    toolsFor = null;
    $("tools-summary").textContent = "Tools";
    $("tools-list").replaceChildren();
    $("tools-notices").hidden = true;
    loadTools();
  }
  history.replaceState(history.state, "", location.pathname + location.search + "#s=" + encodeURIComponent(id));
  if (!store.sessions.has(id)) fetchSession(id);
  ensureHistory(id);
  setSidebar(false);
  renderAll();
  $("prompt").focus();
}

// ---- actions

async function answer(id, outcome) {
  const entry = store.requests.get(id);
  const first = !entry?.sent; // no earlier answer left this tab
  if (entry) entry.sent = true;
  store.setAnswering(id, true);
  try {
    const receipt = await api.respond(id, outcome);
    // The host tells callers apart by HTTP connection, and tabs of one browser share pooled connections:
    // a "duplicate" for this tab's first answer means another tab answered first.
    if (!receipt.accepted && receipt.reason === "duplicate" && first) receipt.shown = "resolved";
    store.setReceipt(id, receipt);
  } catch (err) {
    store.setAnswering(id, false);
    const entry = store.requests.get(id);
    if (entry) entry.error = `Not sent: ${describeError(err)}`;
    store.changed("requests");
  }
}

$("prompt-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const box = $("prompt");
  const text = box.value;
  if (!selected || !text.trim()) return;
  $("send").disabled = true;
  try {
    await api.call("session.prompt", { sessionId: selected, text });
    if (box.value === text) box.value = "";
  } catch (err) {
    notice(`The prompt was not accepted: ${describeError(err)}`, { error: true });
  } finally {
    $("send").disabled = false;
    box.focus();
  }
});

$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !e.altKey && !e.ctrlKey && !e.metaKey) {
    e.preventDefault();
    $("prompt-form").requestSubmit();
  }
});

$("cancel").addEventListener("click", async () => {
  if (!selected) return;
  try {
    const r = await api.call("session.cancel", { sessionId: selected });
    if (!r?.cancelled) notice("Nothing to cancel.");
  } catch (err) {
    notice(`Cancel failed: ${describeError(err)}`, { error: true });
  }
});

$("export").addEventListener("click", async () => {
  if (!selected) return;
  try {
    const blob = await api.exportSession(selected);
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = `agenthost-session-${selected}.jsonl`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (err) {
    notice(`Export failed: ${describeError(err)}`, { error: true });
  }
});

try {
  $("new-cwd").value = localStorage.getItem(CWD_KEY) ?? "";
} catch {
  // no storage
}

$("new-session").addEventListener("submit", async (e) => {
  e.preventDefault();
  const cwd = $("new-cwd").value.trim();
  const title = $("new-title").value.trim();
  const provider = $("new-provider").value;
  const model = $("new-model").value.trim();
  if (!cwd) return;
  const btn = $("create");
  btn.disabled = true;
  try {
    const params = { cwd };
    if (title) params.title = title;
    if (provider) params.provider = provider;
    if (model) params.model = model;
    const r = await api.call("session.create", params);
    try {
      localStorage.setItem(CWD_KEY, cwd);
    } catch {
      // no storage
    }
    $("new-title").value = "";
    if (r?.session) store.upsertSession(r.session);
    select(r.sessionId ?? r.session.id);
  } catch (err) {
    notice(`The session was not created: ${describeError(err)}`, { error: true });
  } finally {
    btn.disabled = false;
  }
});

$("conn-retry").addEventListener("click", () => connection.reconnectNow());

// ---- this tab's recording and the usage panel

$("record").checked = recorder.enabled;
$("record-download").disabled = !recorder.enabled;
$("record").addEventListener("change", () => {
  const was = recorder.enabled;
  recorder.setEnabled($("record").checked);
  $("record-download").disabled = !recorder.enabled;
  if (recorder.enabled && !was) recorder.mark("open", "recording started");
  else if (was && !recorder.enabled) recorder.lines.push(JSON.stringify({ ...recorder.head(), event: "end", detail: "recording stopped" }));
});
$("record-download").addEventListener("click", () => {
  recorder.mark("end", "downloaded"); // the recording is whole up to here
  for (const f of recorder.files()) {
    const url = URL.createObjectURL(f.blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = f.name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }
});

const usage = new UsagePanel({ store, getSelected: () => selected, doc: document });
const usageSeen = new Map(); // sessionId → its ended turns when its totals were last asked for
let usageTimer = null;
// The totals come from the host (session.get: usage, treeUsage, cost); per turn from the stored events.
function refreshUsage() {
  clearTimeout(usageTimer);
  usageTimer = setTimeout(() => {
    if (selected) fetchSession(selected);
  }, 200);
}

// The sidebar is a panel of its own in a narrow window.
function setSidebar(open) {
  document.body.classList.toggle("sidebar-open", open);
  $("toggle-sidebar").setAttribute("aria-expanded", String(open));
}
$("toggle-sidebar").addEventListener("click", () => setSidebar(!document.body.classList.contains("sidebar-open")));

// ---- the token

function showTokenBanner(text) {
  $("token-text").textContent = text;
  $("token-banner").hidden = false;
}

$("token-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const raw = $("token-input").value.trim();
  const m = /#(?:.*&)?k=([^&]+)/.exec(raw);
  const token = m ? decodeURIComponent(m[1]) : raw;
  if (!token) return;
  $("token-input").value = "";
  api.token = token;
  storeToken(token);
  $("token-banner").hidden = true;
  if (connection.stopped) connection.start();
  else connection.reconnectNow();
});

window.addEventListener("online", () => connection.reconnectNow());

renderAll();
if (api.token) {
  connection.start();
} else {
  onState({ state: "no-token" });
  showTokenBanner("No access token. Open the launch URL printed by “agenthost serve” (or “agenthost url”), or paste it here.");
}
if (selected) select(selected);
else setSidebar(true); // a narrow window starts on the session list
