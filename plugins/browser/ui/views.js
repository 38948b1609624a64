// DOM views. Every text from the host goes through textContent (never innerHTML) — except an assistant
// message's Markdown, which DOMPurify sanitizes first (markdownBody) — so event data cannot
// inject markup; the CSP (no inline script or style) is a second layer.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on") && typeof v === "function") node.addEventListener(k.slice(2), v);
    else if (v === true) node.setAttribute(k, "");
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// Node.append() turns null into the text "null": skip the absent parts.
function append(parent, ...children) {
  parent.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

export function shortId(id) {
  return typeof id === "string" ? id.slice(-8) : "";
}

export function sessionLabel(s) {
  if (!s) return "";
  if (s.title) return s.title;
  const dir = typeof s.cwd === "string" ? s.cwd.split("/").filter(Boolean).pop() || "/" : "";
  return dir ? `${dir} · ${shortId(s.id)}` : `session ${shortId(s.id)}`;
}

function compact(v) {
  try {
    return JSON.stringify(v);
  } catch {
    return String(v);
  }
}

function pretty(v) {
  try {
    return JSON.stringify(v, null, 2);
  } catch {
    return String(v);
  }
}

// The text of prompt content blocks: text as is, a resource link as [name](uri), other blocks named.
export function contentText(content) {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((b) => {
      if (b?.type === "text" && typeof b.text === "string") return b.text;
      if (b?.type === "resource_link") return `[${b.name ?? b.uri}](${b.uri})`;
      return `[${b?.type ?? "block"}]`;
    })
    .join("");
}

// ---- connection indicator

const STATE_TEXT = {
  idle: "Not connected",
  connecting: "Connecting…",
  ready: "Connected",
  degraded: "Connected (degraded)",
  waiting: "Reconnecting",
  unauthorized: "Token refused",
  stopped: "Disconnected",
  "no-token": "No access token",
};

export function renderConnection(root, state, now = Date.now()) {
  const text = root.querySelector("#conn-text");
  const retry = root.querySelector("#conn-retry");
  let label = STATE_TEXT[state.state] ?? state.state;
  if ((state.state === "waiting" || state.state === "unauthorized") && state.retryAt) {
    const s = Math.max(0, Math.ceil((state.retryAt - now) / 1000));
    label += ` in ${s} s`;
  }
  root.dataset.state = state.state;
  if (state.generation !== undefined) root.dataset.generation = String(state.generation);
  document.body.dataset.connection = state.state;
  text.textContent = label;
  root.title = state.reason ? `last: ${state.reason}` : "";
  retry.hidden = !(state.state === "waiting" || state.state === "unauthorized");
}

// ---- session list

export function renderSessionList(ul, store, selectedId, onSelect) {
  const pendingBySession = new Map();
  for (const r of store.pendingRequests()) {
    const sid = r.request.sessionId;
    pendingBySession.set(sid, (pendingBySession.get(sid) ?? 0) + 1);
  }
  const items = store.sortedSessions().map((s) => {
    const status = s.closed ? "closed" : s.status ?? "idle";
    // The host's summary (Remote sessions.pending) when the UI has one, else the requests this tab holds.
    const summary = store.pendingSummaries?.get(s.id);
    const pending = summary ? summary.requests.length : pendingBySession.get(s.id) ?? 0;
    const tags = Array.isArray(s.tags) ? s.tags.filter((t) => typeof t === "string") : [];
    const btn = el(
      "button",
      {
        type: "button",
        class: "session-item",
        "aria-current": s.id === selectedId ? "true" : null,
        dataset: { sessionId: s.id, status },
        onclick: () => onSelect(s.id),
      },
      el("span", { class: "session-title", text: sessionLabel(s) }),
      el(
        "span",
        { class: "session-meta" },
        el("span", { class: `badge status-${status}`, text: status }),
        pending
          ? el("span", {
              class: "badge badge-attn badge-pending",
              dataset: { pending: String(pending), source: summary ? "remote" : "local" },
              title: summary ? pendingTitle(summary) : null,
              text: `${pending} pending`,
            })
          : null,
        s.depth ? el("span", { class: "badge", text: "subagent" }) : null,
        tags.map((t) => el("span", { class: "badge badge-tag", text: t })),
      ),
    );
    return el("li", {}, btn);
  });
  if (items.length === 0) items.push(el("li", { class: "empty-note", text: "No sessions yet." }));
  ul.replaceChildren(...items);
}

// "1 approval, 0 questions" for a sessions.pending summary.
export function pendingTitle(summary) {
  const n = (k, one, many) => `${k} ${k === 1 ? one : many}`;
  const other = summary.requests.length - summary.approvals - summary.questions;
  return [
    n(summary.approvals, "approval", "approvals"),
    n(summary.questions, "question", "questions"),
    other > 0 ? n(other, "other request", "other requests") : null,
  ]
    .filter(Boolean)
    .join(", ");
}

// ---- conversation

// Assistant text as Markdown: parsed by marked and sanitized by DOMPurify (the system's copies, served at
// /vendor/), the only HTML this UI inserts; links open in a new tab without a referrer. Without both
// libraries the text stays plain (textContent).
function markdownBody(text) {
  const body = el("div", { class: "msg-body" });
  const md = globalThis.marked;
  const purify = globalThis.DOMPurify;
  if (typeof text !== "string" || !md?.parse || !purify?.sanitize) {
    body.textContent = typeof text === "string" ? text : compact(text);
    return body;
  }
  body.classList.add("markdown");
  const html = purify.sanitize(md.parse(text, { gfm: true, breaks: false, mangle: false, headerIds: false }), {
    USE_PROFILE: { html: true },
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
    FORBID_ATTR: ["style"],
  });
  body.innerHTML = html.trim();
  for (const a of body.querySelectorAll("a[href]")) {
    a.setAttribute("target", "_blank");
    a.setAttribute("rel", "noopener noreferrer");
  }
  return body;
}

// A hook's run (hook/ran): which hook, at which point, for which tool, what it decided and how long it took.
function hookNode(base, d) {
  const denied = d.outcome === "deny" || (d.outcome === "error" && d.onError === "deny");
  const what =
    d.outcome === "deny"
      ? `denied${d.reason ? `: ${d.reason}` : ""}`
      : d.outcome === "error"
        ? `failed: ${d.error ?? "?"} (on_error ${d.onError ?? "?"}${denied ? ": denied" : ": allowed"})`
        : d.outcome === "amend"
          ? "amended"
          : d.outcome === "allow"
            ? "allowed"
            : (d.outcome ?? "?");
  const on = d.tool ? ` · ${d.tool}` : "";
  const ms = Number.isFinite(d.durationMs) ? ` · ${d.durationMs} ms` : "";
  return el("li", {
    ...base,
    class: `ev ev-hook outcome-${d.outcome ?? "unknown"}${denied ? " is-error" : ""}`,
    text: `Hook ${d.hook ?? "?"} (${d.event ?? "?"}${on}): ${what}${ms}`,
  });
}

function eventNode(ev) {
  const d = ev.data ?? {};
  const base = { dataset: { seq: String(ev.seq), kind: ev.kind }, "data-cursor": ev.cursor ?? null };
  const time = typeof ev.time === "string" ? ev.time.slice(11, 19) : "";
  switch (ev.kind) {
    case "inbox/received":
      return el(
        "li",
        { ...base, class: "msg msg-user" },
        el("div", { class: "msg-head" }, el("span", { class: "who", text: "You" }), el("time", { text: time })),
        el("div", { class: "msg-body", text: contentText(d.content) }),
      );
    case "message/committed":
      return el(
        "li",
        { ...base, class: "msg msg-assistant" },
        el("div", { class: "msg-head" }, el("span", { class: "who", text: "Assistant" }), el("time", { text: time })),
        markdownBody(d.text),
      );
    case "tool/call":
      return el(
        "li",
        { ...base, class: "ev ev-tool", dataset: { ...base.dataset, callId: d.callId ?? "" } },
        el(
          "details",
          {},
          el("summary", {}, el("span", { class: "ev-label", text: `Tool call · ${d.name ?? "?"}` }), " ",
            el("code", { class: "ev-args", text: compact(d.args ?? {}).slice(0, 120) }), " ",
            el("span", { class: "ev-progress", role: "status" })),
          el("pre", { class: "ev-args-full", text: pretty(d.args ?? {}) }),
        ),
      );
    case "turn/notice": {
      const retry = d.kind === "retry";
      return el("li", {
        ...base,
        class: `ev ev-notice notice-${d.kind ?? "note"}`,
        role: retry ? "status" : null,
        text: retry ? `Retrying: ${d.message ?? ""}` : d.kind === "history-cut" ? `Older messages left out to fit the context window (${d.dropped ?? "?"})` : `${d.kind ?? "note"}: ${d.message ?? compact(d)}`,
      });
    }
    case "tool/approval":
      return el("li", {
        ...base,
        class: `ev ev-approval outcome-${d.outcome ?? "unknown"}`,
        text: `Approval ${d.outcome ?? "?"}${d.optionId ? ` (${d.optionId})` : ""} · ${d.name ?? ""}`,
      });
    case "tool/result":
      return el(
        "li",
        { ...base, class: `ev ev-result${d.isError ? " is-error" : ""}` },
        el(
          "details",
          {},
          el("summary", { text: `Result · ${d.name ?? "?"}${d.isError ? " (error)" : ""}` }),
          el("pre", { text: pretty(d.result) }),
        ),
      );
    case "hook/ran":
      return hookNode(base, d);
    case "question/asked":
      return el("li", { ...base, class: "ev ev-question", text: `Question: ${d.question ?? ""}` });
    case "question/answered":
      return el("li", {
        ...base,
        class: "ev ev-question",
        text: d.outcome === "answered" ? `Answer: ${typeof d.answer === "string" ? d.answer : compact(d.answer)}` : "Question cancelled",
      });
    case "turn/ended": {
      const reason = d.reason ?? "?";
      return el("li", {
        ...base,
        class: `ev ev-turn-end reason-${reason}`,
        text: reason === "end" ? "turn ended" : `turn ended: ${reason}${d.error ? ` — ${d.error}` : ""}`,
      });
    }
    case "subagent/started":
      return el("li", { ...base, class: "ev", text: `Subagent started (${shortId(d.sessionId)})` });
    case "subagent/finished":
      return el("li", { ...base, class: "ev", text: `Subagent finished: ${d.reason ?? "?"}` });
    case "agent/error":
      return el("li", { ...base, class: "ev is-error", text: `Agent error: ${d.message ?? ""}` });
    case "inbox/cancelled":
      return el("li", { ...base, class: "ev", text: `A queued prompt was cancelled (${d.reason ?? "?"}): it never ran` });
    case "inbox/claimed":
    case "turn/started":
      return null; // bookkeeping, not shown
    default:
      return el("li", { ...base, class: "ev ev-unknown", text: `${ev.kind} ${compact(d)}` });
  }
}

// Renders a session's events incrementally: each seq once, in seq order, whatever order they arrive in;
// streamed text of running turns after them.
export class ConversationView {
  constructor(list, scroller) {
    this.list = list;
    this.scroller = scroller;
    this.sessionId = null;
    this.rendered = new Map(); // seq → element or null (not shown)
    this.streamNodes = new Map(); // turnId → element
    // Follow the end of the conversation while the user is there, also when the pane shrinks (a request
    // card appears above it) or grows.
    this.atBottom = true;
    scroller.addEventListener("scroll", () => {
      this.atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 48;
    });
    if (globalThis.ResizeObserver) {
      new ResizeObserver(() => {
        if (this.atBottom) scroller.scrollTop = scroller.scrollHeight;
      }).observe(scroller);
    }
  }

  show(sessionId) {
    if (sessionId === this.sessionId) return;
    this.sessionId = sessionId;
    this.rendered.clear();
    this.streamNodes.clear();
    this.list.replaceChildren();
    this.atBottom = true;
  }

  update(store) {
    if (!this.sessionId) return;
    const stick = this.atBottom;
    const events = store.sortedEvents(this.sessionId);
    let next = null; // insert each new event before the first rendered node with a higher seq
    for (let i = events.length - 1; i >= 0; i--) {
      const ev = events[i];
      if (this.rendered.has(ev.seq)) {
        const node = this.rendered.get(ev.seq);
        if (node) next = node;
        continue;
      }
      const node = eventNode(ev);
      this.rendered.set(ev.seq, node);
      if (node) {
        this.list.insertBefore(node, next ?? this.firstStreamNode());
        next = node;
      }
    }
    // A running tool's progress on its call (cleared when the result or the turn's end arrives).
    const progress = store.progress.get(this.sessionId);
    for (const span of this.list.querySelectorAll("li.ev-tool .ev-progress")) {
      const text = progress?.get(span.closest("li").dataset.callId) ?? "";
      if (span.textContent !== text) span.textContent = text;
    }
    const live = new Map(store.streamingOf(this.sessionId));
    for (const [turnId, node] of this.streamNodes) {
      if (!live.has(turnId)) {
        node.remove();
        this.streamNodes.delete(turnId);
      }
    }
    // A turn that streams reasoning before any text shows it too (collapsed).
    for (const [turnId] of store.reasoning.get(this.sessionId)?.entries() ?? []) {
      if (!live.has(turnId)) live.set(turnId, "");
    }
    for (const [turnId, text] of live) {
      let node = this.streamNodes.get(turnId);
      if (!node) {
        node = el(
          "li",
          { class: "msg msg-assistant msg-streaming", dataset: { turnId }, "aria-live": "polite", "aria-busy": "true" },
          el("div", { class: "msg-head" }, el("span", { class: "who", text: "Assistant" }), el("span", { class: "typing", text: "writing…" })),
          el("details", { class: "reasoning", hidden: true }, el("summary", { text: "Reasoning" }), el("pre", { class: "reasoning-text" })),
          el("div", { class: "msg-body" }),
        );
        this.streamNodes.set(turnId, node);
        this.list.append(node);
      }
      const reasoning = store.reasoningOf(this.sessionId, turnId);
      const box = node.querySelector("details.reasoning");
      box.hidden = reasoning === "";
      const pre = box.querySelector(".reasoning-text");
      if (pre.textContent !== reasoning) pre.textContent = reasoning;
      const body = node.querySelector(".msg-body");
      if (body.textContent !== text) body.textContent = text;
    }
    if (stick) {
      this.scroller.scrollTop = this.scroller.scrollHeight;
      this.atBottom = true;
    }
  }

  firstStreamNode() {
    for (const node of this.streamNodes.values()) return node;
    return null;
  }
}

// ---- server request cards (approvals and questions), for every session, answerable from any tab

const APPROVAL_BUTTONS = [
  ["allow_once", "Allow once", "btn-primary"],
  ["allow_always", "Allow always", ""],
  ["reject_once", "Reject", "btn-danger"],
];

const RECEIPT_TEXT = {
  resolved: "Already answered elsewhere — your answer was not used.",
  duplicate: "You already answered this request.",
  unknown: "The host no longer knows this request.",
};

export function renderRequests(container, store, { selectedId, sessionName, onAnswer, onOpen }) {
  const cards = new Map([...container.querySelectorAll(".request-card")].map((n) => [n.dataset.requestId, n]));
  const want = store.pendingRequests();
  const keep = new Set();
  for (const entry of want) {
    const r = entry.request;
    keep.add(r.id);
    let card = cards.get(r.id);
    if (!card) {
      card = buildCard(r, { selectedId, sessionName, onAnswer, onOpen });
      container.append(card);
    }
    const busy = Boolean(entry.answering) || Boolean(entry.receipt) || Boolean(entry.resolvedState);
    for (const b of card.querySelectorAll("button.answer, input, textarea")) b.disabled = busy;
    const note = card.querySelector(".receipt");
    const text = entry.receipt
      ? entry.receipt.accepted
        ? "Answered."
        : RECEIPT_TEXT[entry.receipt.shown ?? entry.receipt.reason] ?? `Not accepted (${entry.receipt.reason ?? "?"}).`
      : entry.error ?? "";
    if (note.textContent !== text) note.textContent = text;
    card.dataset.receipt = entry.receipt
      ? entry.receipt.accepted
        ? "accepted"
        : entry.receipt.shown ?? entry.receipt.reason ?? "refused"
      : "";
    if (entry.receipt?.reason) card.dataset.receiptReason = entry.receipt.reason;
  }
  for (const [id, card] of cards) if (!keep.has(id)) card.remove();
  container.hidden = keep.size === 0;
}

function buildCard(r, { sessionName, onAnswer, onOpen }) {
  const kind = r.kind === "question" || r.method === "request.question" ? "question" : "approval";
  const p = r.params ?? {};
  const headingId = `req-${r.id}-h`;
  const card = el("article", {
    class: `request-card request-${kind}`,
    role: "group",
    "aria-labelledby": headingId,
    dataset: { requestId: r.id, sessionId: r.sessionId, kind },
  });
  const open = el("button", { type: "button", class: "linklike", text: sessionName(r.sessionId), onclick: () => onOpen(r.sessionId) });
  if (kind === "approval") {
    append(
      card,
      el("h3", { id: headingId, text: `Approve ${p.tool ?? "a tool"}?` }),
      el("p", { class: "request-session" }, "Session: ", open),
      p.args && typeof p.args.command === "string"
        ? el("pre", { class: "request-command", text: p.args.command })
        : el("pre", { class: "request-command", text: pretty(p.args ?? {}) }),
      p.cwd ? el("p", { class: "request-cwd", text: `in ${p.cwd}` }) : null,
    );
    const options = Array.isArray(r.options) && r.options.length ? r.options : APPROVAL_BUTTONS.map((b) => b[0]);
    const row = el("div", { class: "request-actions" });
    for (const [optionId, label, cls] of APPROVAL_BUTTONS) {
      if (!options.includes(optionId)) continue;
      row.append(
        el("button", {
          type: "button",
          class: `answer ${cls}`,
          dataset: { option: optionId },
          text: label,
          onclick: () => onAnswer(r.id, { value: { optionId } }),
        }),
      );
    }
    card.append(row);
  } else {
    const inputId = `req-${r.id}-answer`;
    const input = el("input", { id: inputId, type: "text", class: "answer-input", autocomplete: "off" });
    const form = el(
      "form",
      {
        class: "request-actions",
        onsubmit: (e) => {
          e.preventDefault();
          onAnswer(r.id, { value: { answer: input.value } });
        },
      },
      el("label", { for: inputId, text: "Your answer" }),
      input,
      el("button", { type: "submit", class: "answer btn-primary", text: "Answer" }),
      el("button", {
        type: "button",
        class: "answer",
        text: "Dismiss",
        onclick: () => onAnswer(r.id, { error: { code: "cancelled", message: "dismissed by the user" } }),
      }),
    );
    const opts = Array.isArray(r.options) ? r.options.filter((o) => typeof o === "string") : [];
    append(
      card,
      el("h3", { id: headingId, text: "Question" }),
      el("p", { class: "request-session" }, "Session: ", open),
      el("p", { class: "request-question", text: p.question ?? "" }),
      opts.length
        ? el(
            "div",
            { class: "request-options" },
            opts.map((o) =>
              el("button", { type: "button", class: "answer", text: o, onclick: () => onAnswer(r.id, { value: { answer: o } }) }),
            ),
          )
        : null,
      form,
    );
  }
  card.append(el("p", { class: "receipt", role: "status" }));
  return card;
}
