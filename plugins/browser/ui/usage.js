// The usage panel of the shown session: its own usage and its tree's (the host's totals from session.get:
// usage, treeUsage, cost, treeCost — computed there, never here), and tokens per turn as a chart (Chart.js,
// Debian's libjs-chart.js) from the session's stored events: a turn's model/usage round trips when it has
// them, else its turn/ended usage (docs/usage.md).

const fmt = (n) => (Number.isFinite(n) ? n.toLocaleString("en-US") : "0");

export function turnsOf(events) {
  const turns = new Map(); // turnId → {turnId, input, cached, output, reasoning, rounds, ended}
  for (const ev of events) {
    if (!ev.turnId) continue;
    let t = turns.get(ev.turnId);
    if (!t) {
      t = { turnId: ev.turnId, input: 0, cached: 0, output: 0, reasoning: 0, rounds: 0, end: null, ended: false };
      turns.set(ev.turnId, t);
    }
    const u = ev.data?.usage;
    if (ev.kind === "model/usage" && u) {
      t.rounds++;
      t.input += u.inputTokens ?? 0;
      t.cached += u.cachedInputTokens ?? 0;
      t.output += u.outputTokens ?? 0;
      t.reasoning += u.reasoningTokens ?? 0;
    } else if (ev.kind === "turn/ended") {
      t.ended = true;
      t.end = u ?? null;
    }
  }
  const out = [];
  for (const t of turns.values()) {
    if (!t.rounds && t.end) {
      t.input = t.end.inputTokens ?? 0;
      t.cached = t.end.cachedInputTokens ?? 0;
      t.output = t.end.outputTokens ?? 0;
      t.reasoning = t.end.reasoningTokens ?? 0;
    }
    if (t.rounds || t.ended) out.push(t);
  }
  return out;
}

function costText(c) {
  if (!c) return "—";
  let s = `${c.amount} ${c.currency}`;
  if (c.unpricedItems) s += ` + unpriced (${c.unpricedWhy ?? "no rate"})`;
  return s;
}

export class UsagePanel {
  constructor({ store, getSelected, doc = document }) {
    this.store = store;
    this.getSelected = getSelected;
    this.doc = doc;
    this.chart = null;
  }

  endedTurns(sessionId) {
    let n = 0;
    for (const ev of this.store.eventsOf(sessionId).values()) if (ev.kind === "turn/ended") n++;
    return n;
  }

  render() {
    const id = this.getSelected();
    if (!id) return;
    const s = this.store.sessions.get(id);
    const table = this.doc.getElementById("usage-table");
    const rows = [["", "input", "cached", "output", "reasoning", "requests", "turns", "cost"]];
    const line = (label, u, c) => [
      label,
      fmt(u?.inputTokens),
      fmt(u?.cachedInputTokens),
      fmt(u?.outputTokens),
      fmt(u?.reasoningTokens),
      fmt(u?.requests),
      fmt(u?.turns),
      costText(c),
    ];
    rows.push(line("this session", s?.usage, s?.cost));
    if (s?.treeUsage && s.treeUsage.sessions > 1) rows.push(line(`with its ${s.treeUsage.sessions - 1} subagent session(s)`, s.treeUsage, s.treeCost));
    table.replaceChildren(
      ...rows.map((r, i) => {
        const tr = this.doc.createElement("tr");
        for (const cell of r) {
          const td = this.doc.createElement(i === 0 ? "th" : "td");
          td.textContent = cell;
          tr.append(td);
        }
        return tr;
      }),
    );
    const u = s?.usage;
    this.doc.getElementById("usage-summary").textContent = u
      ? `Usage: ${fmt(u.inputTokens)} in · ${fmt(u.outputTokens)} out${s?.cost ? " · " + costText(s.cost) : ""}`
      : "Usage";
    this.drawChart(turnsOf(this.store.sortedEvents(id)));
  }

  drawChart(turns) {
    const Chart = globalThis.Chart;
    const canvas = this.doc.getElementById("usage-chart");
    if (!Chart || !canvas) return; // the table alone
    const labels = turns.map((_, i) => `turn ${i + 1}`);
    const data = {
      labels,
      datasets: [
        { label: "input (uncached)", data: turns.map((t) => t.input - t.cached), stack: "in" },
        { label: "cached input", data: turns.map((t) => t.cached), stack: "in" },
        { label: "output", data: turns.map((t) => t.output), stack: "out" },
      ],
    };
    canvas.dataset.turns = String(turns.length);
    canvas.dataset.tokens = JSON.stringify(turns.map((t) => [t.input, t.cached, t.output]));
    if (this.chart) {
      this.chart.data = data;
      this.chart.update("none");
      return;
    }
    this.chart = new Chart(canvas, {
      type: "bar",
      data,
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true } },
      },
    });
  }
}
