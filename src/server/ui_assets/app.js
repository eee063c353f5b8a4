// The operator's page: polls /ui/state and /top every 2 s and renders them with DOM
// calls only (textContent, never innerHTML): the values shown are request values, which
// a caller chooses. Served from the binary; talks to this origin only.
"use strict";

const REFRESH_MS = 2000;
const TOP_PER_RULE = 5;

const $ = (id) => document.getElementById(id);

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fill(tbody, rows, render) {
  const fresh = document.createElement("tbody");
  for (const r of rows) {
    const tr = document.createElement("tr");
    render(tr, r);
    fresh.appendChild(tr);
  }
  tbody.replaceWith(fresh);
}

const when = (unix) => new Date(unix * 1000).toLocaleString();
const rate = (x) => (x >= 10 ? x.toFixed(0) : x.toFixed(1));
const ms = (x) => (x >= 10 ? x.toFixed(0) : x >= 1 ? x.toFixed(1) : x.toFixed(2)) + " ms";

// One <img> per rule, kept across refreshes (only its src changes) so the table does not
// flicker; keyed by domain and rule.
const charts = new Map();

function chart(domain, rule, now) {
  const key = domain + "\u0000" + rule;
  let img = charts.get(key);
  if (!img) {
    img = document.createElement("img");
    img.className = "chart";
    img.width = 360;
    img.height = 96;
    charts.set(key, img);
  }
  const q = new URLSearchParams({ domain, rule, t: String(Date.now()) });
  img.src = "/ui/chart.svg?" + q.toString();
  img.alt = now
    ? `${rule}: ${rate(now.ok_per_second)} admitted and ${rate(now.over_per_second)} refused per second now`
    : `${rule}: no hits counted`;
  return img;
}

function renderState(s) {
  const c = s.config;
  const ev = c.events;
  const from = ev.source ? ` from ${ev.source}` : "";
  $("config-summary").textContent =
    `Config ${c.hash.slice(0, 12)} loaded${from} ${when(ev.loaded_at)} (${ev.loads} load${ev.loads === 1 ? "" : "s"} since start).`;
  const rej = $("rejected");
  if (ev.rejected) {
    rej.hidden = false;
    $("rejected-at").textContent = `at ${when(ev.rejected.at)} (${ev.rejected.source})`;
    $("rejected-error").textContent = ev.rejected.error;
  } else {
    rej.hidden = true;
  }
  const rates = new Map(s.rates.map((r) => [r.domain + "\u0000" + r.rule, r]));
  const rows = [];
  for (const d of c.domains) for (const r of d.rules) rows.push({ domain: d.name, ...r });
  fill($("rules").tBodies[0], rows, (tr, r) => {
    const now = rates.get(r.domain + "\u0000" + r.rule);
    cell(tr, r.domain);
    cell(tr, r.rule);
    cell(tr, r.limit + (r.flags.length ? " (" + r.flags.join(", ") + ")" : ""));
    cell(tr, r.source);
    cell(tr, now ? `${rate(now.ok_per_second)} / ${rate(now.over_per_second)}` : "–", "num");
    const td = cell(tr, "");
    if (s.top_values) td.appendChild(chart(r.domain, r.rule, now));
    else td.textContent = "off (--no-top-values)";
  });
  renderStore(s.store);
}

function renderStore(st) {
  const dl = document.createElement("dl");
  dl.id = "store-summary";
  const item = (k, v) => {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dl.append(dt, dd);
  };
  item("Health check", st.check);
  item("Circuit breaker", st.circuit === null ? "none (memory store)" : st.circuit);
  item("Leases", st.leases_on ? `on, ${st.leased_tokens} tokens outstanding` : "off");
  $("store-summary").replaceWith(dl);
  fill($("store-calls").tBodies[0], st.calls, (tr, c) => {
    cell(tr, c.operation);
    cell(tr, c.outcome);
    cell(tr, String(c.count), "num");
    cell(tr, c.mean_ms === null ? "–" : ms(c.mean_ms), "num");
    cell(tr, c.p99_at_most_ms === null ? "–" : "≤ " + ms(c.p99_at_most_ms), "num");
  });
  fill($("hottest").tBodies[0], st.hottest, (tr, b) => {
    cell(tr, b.entity);
    cell(tr, b.resource);
    cell(tr, String(b.shards), "num");
  });
}

function renderTop(t) {
  $("top-note").textContent = t.enabled
    ? `Counts are estimates: the true count is within ± error. Window: ${t.window_seconds / 60} minutes.`
    : "Top values are off (--no-top-values).";
  for (const side of ["refused", "admitted"]) {
    const rules = t.rules
      .filter((r) => r[side].top.length > 0)
      .sort((a, b) => b[side].total - a[side].total);
    const rows = [];
    for (const r of rules) for (const v of r[side].top) rows.push({ rule: r.rule, ...v });
    fill($("top-" + side).tBodies[0], rows, (tr, v) => {
      cell(tr, v.rule);
      cell(tr, v.value);
      cell(tr, String(v.count), "num");
      cell(tr, String(v.error), "num");
      cell(tr, (100 * v.share).toFixed(1) + " %", "num");
    });
  }
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

let busy = false;
async function refresh() {
  if (busy) return;
  busy = true;
  try {
    const [state, top] = await Promise.all([
      getJson("/ui/state"),
      getJson("/top?n=" + TOP_PER_RULE),
    ]);
    renderState(state);
    renderTop(top);
    $("status").textContent = "Updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("status").textContent = "Cannot reach the server: " + e.message;
  } finally {
    busy = false;
  }
}

function entries(text) {
  return text
    .split(/[\n,]/)
    .map((e) => e.trim())
    .filter((e) => e.length > 0)
    .map((e) => {
      const at = e.indexOf("=");
      if (at < 1) throw new Error(`'${e}' is not key=value`);
      return { key: e.slice(0, at), value: e.slice(at + 1) };
    });
}

async function explain(event) {
  event.preventDefault();
  const out = $("explain-answer");
  try {
    const body = {
      domain: $("explain-domain").value.trim(),
      descriptors: [{ entries: entries($("explain-entries").value) }],
    };
    const hits = $("explain-hits").value.trim();
    if (hits) body.hitsAddend = Number(hits);
    const r = await fetch("/explain", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    out.textContent = await r.text();
  } catch (e) {
    out.textContent = e.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("explain-form").addEventListener("submit", explain);
  refresh();
  setInterval(refresh, REFRESH_MS);
});
