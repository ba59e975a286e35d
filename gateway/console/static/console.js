// The operator console: polls /console/api/state once a second and draws it. Plain DOM code,
// no framework and nothing fetched from elsewhere. Text from the gateway (tenant ids, error
// messages) only ever goes in through textContent, never as HTML.
"use strict";

const POLL_MS = 1000;
const KEEP_POINTS = 300;
const KEY_STORE = "tiergate-admin-key";
const series = new Map();          // tier -> points (oldest first), merged across polls
let lastPoint = null;               // newest point time seen: the next poll asks for newer ones
let knownTiers = "";

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k === "style") Object.assign(node.style, v);   // CSSOM: the page's CSP forbids inline style text
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c === null || c === undefined ? "" : c);
  return node;
}

function fmt(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return v.toLocaleString("en");
  return v.toFixed(digits === undefined ? 1 : digits);
}
const pct = (v) => (v === null || v === undefined ? "–" : (v * 100).toFixed(1) + " %");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString("en-GB") : "–");
const stamp = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z" : "never");

// ---- the admin key: from the URL fragment (#key=...) or the form, kept for this tab only ----
function adminKey() {
  const m = location.hash.match(/(?:^#|&)key=([^&]+)/);
  if (m) {
    sessionStorage.setItem(KEY_STORE, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);   // not left in the address bar
  }
  return sessionStorage.getItem(KEY_STORE);
}

$("#login").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY_STORE, $("#admin-key").value.trim());
  $("#login").hidden = true;
  poll();
});

function setStatus(kind, text) {
  const s = $("#status");
  s.dataset.status = kind;
  s.textContent = text;
}

// ---- polling ----
let timer = null;
async function poll() {
  clearTimeout(timer);
  const key = adminKey();
  const headers = key ? { Authorization: "Bearer " + key } : {};
  const url = "/console/api/state" + (lastPoint === null ? "" : "?since=" + lastPoint);
  try {
    const resp = await fetch(url, { headers, cache: "no-store" });
    if (resp.status === 401 || resp.status === 403) {
      setStatus("locked", "admin key needed");
      $("#login").hidden = false;
      $("#login-error").textContent = key ? "that key was refused" : "";
      return;                       // the form submits and polls again
    }
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    render(await resp.json());
    setStatus("live", "live");
  } catch (err) {
    setStatus("error", "no data: " + err.message);
  }
  timer = setTimeout(poll, POLL_MS);
}

// ---- drawing ----
function render(doc) {
  $("#replica").textContent = "replica " + doc.replica;
  $("#updated").textContent = "updated " + clock(doc.now);
  renderConfig(doc.config);
  renderTiers(doc.tiers);
  renderRouting(doc.routing);
  renderBreakers(doc.breakers);
  renderBudgets(doc.budgets);
}

function renderConfig(c) {
  const rows = [["digest", c.digest.slice(0, 16)], ["generation", c.generation], ["file", c.path || "–"],
    ["last reload", stamp(c.reloaded_at)],
    ["last rejected reload", c.rejected ? stamp(c.rejected.at) + " (" + c.rejected.why + "): " + c.rejected.error : "none"]];
  const dl = $("#config");
  dl.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-config": k }, String(v))]));
}

function mergeSeries(tier) {
  const have = series.get(tier.name) || [];
  const merged = have.concat(tier.series.points.filter((p) => !have.length || p[0] > have[have.length - 1][0]));
  const kept = merged.slice(-KEEP_POINTS);
  series.set(tier.name, kept);
  return kept;
}

function column(points, fields, name) {
  const i = fields.indexOf(name);
  return points.map((p) => p[i]);
}

function spark(values) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 160 22");
  svg.setAttribute("preserveAspectRatio", "none");
  const nums = values.map((v) => (v === null || v === undefined ? null : v));
  const max = Math.max(1e-9, ...nums.filter((v) => v !== null));
  const step = nums.length > 1 ? 160 / (nums.length - 1) : 0;
  let last = 0;
  const pts = nums.map((v, i) => {
    if (v !== null) last = v;
    return (i * step).toFixed(1) + "," + (21 - (last / max) * 20).toFixed(1);
  });
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", pts.join(" "));
  svg.append(line);
  return svg;
}

function rate(points, fields, name, seconds) {
  const recent = points.slice(-seconds);
  if (!recent.length) return 0;
  const sum = column(recent, fields, name).reduce((a, b) => a + (b || 0), 0);
  return sum / Math.max(1, recent[recent.length - 1][0] - recent[0][0] + 1);
}

function lastValue(values) {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return values[i];
  return null;
}

function renderTiers(tiers) {
  const names = tiers.map((t) => t.name).join(",");
  const box = $("#tiers");
  let newest = null;                // the newest point now held: the next poll asks for newer ones only
  const changed = names !== knownTiers;
  if (changed) {
    box.replaceChildren();
    knownTiers = names;
    for (const name of [...series.keys()]) if (!tiers.some((t) => t.name === name)) series.delete(name);
  }
  for (const t of tiers) {
    const points = mergeSeries(t);
    if (points.length && (newest === null || points[points.length - 1][0] > newest)) newest = points[points.length - 1][0];
    const f = t.series.fields;
    const tokS = rate(points, f, "output_tokens", 10);
    const ttft = column(points, f, "ttft_ms"), tpot = column(points, f, "tpot_ms");
    const figures = [
      ["calls", t.series.totals.requests], ["failed", t.series.totals.errors],
      ["in flight", t.in_flight + (t.max_in_flight ? " / " + t.max_in_flight : "")],
      ["queue", t.queue], ["running", t.running], ["KV use", pct(t.kv_usage)],
      ["prefix hit rate", pct(t.prefix_hit_rate)], ["output tok/s (10 s)", fmt(tokS)],
      ["output tokens", t.series.totals.output_tokens], ["spec acceptance", pct(t.spec_acceptance)],
    ];
    const fieldNames = ["requests", "errors", "in_flight", "queue", "running", "kv_usage", "prefix_hit_rate",
      "tokens_per_s", "output_tokens", "spec_acceptance"];
    const dl = el("dl", { class: "figures" });
    figures.forEach(([label, value], i) => dl.append(el("dt", {}, label),
      el("dd", { "data-field": fieldNames[i] }, typeof value === "string" ? value : fmt(value))));
    const sparks = el("div", { class: "sparks" });
    const tokSeries = column(points, f, "output_tokens");
    for (const [label, values, now] of [["tokens/s", tokSeries, fmt(tokS)],
      ["TTFT ms", ttft, fmt(lastValue(ttft))], ["TPOT ms", tpot, fmt(lastValue(tpot))],
      ["queue", column(points, f, "queue"), fmt(t.queue)], ["in flight", column(points, f, "in_flight"), fmt(t.in_flight)]]) {
      sparks.append(el("span", {}, label), spark(values), el("b", {}, now));
    }
    const head = el("h3", {}, t.name, el("span", { class: "state", "data-state": t.state }, t.state),
      el("span", { class: "note" }, t.kind + (t.dtype ? " · " + t.dtype : "")));
    const card = el("div", { class: "card", "data-tier": t.name, "data-state": t.state }, head, dl, sparks);
    if (t.error) card.append(el("p", { class: "error" }, t.error));
    const old = box.querySelector(`[data-tier="${CSS.escape(t.name)}"]`);
    if (old) old.replaceWith(card); else box.append(card);
  }
  // A tier set that changed (a reload) was fetched with `since`: a new tier's history is then
  // missing, so the next poll asks for every point again.
  if (changed) lastPoint = null;
  else if (newest !== null) lastPoint = newest;
}

const PALETTE = ["#58a6ff", "#3fb950", "#d29922", "#bc8cff", "#f778ba", "#39c5cf", "#ff9b50"];

function renderRouting(r) {
  const share = $("#share");
  const entries = Object.entries(r.share).filter(([, s]) => s.requests > 0);
  share.replaceChildren(...entries.map(([name, s], i) => el("div", {
    style: { width: `${(s.share * 100).toFixed(2)}%`, background: PALETTE[i % PALETTE.length] },
    title: `${name}: ${s.requests} requests`, "data-share": name }, `${name} ${(s.share * 100).toFixed(0)} %`)));
  if (!entries.length) share.replaceChildren(el("div", { class: "note" }, "no traffic in the last minutes"));
  const rows = r.decisions.map((d) => {
    const detours = d.fallbacks.map((s) => `${s.tier}: ${s.reason}${s.detail ? " (" + s.detail + ")" : ""}`);
    if (d.escalated_from) detours.push(`escalated from ${d.escalated_from}`);
    if (d.cascade && !d.cascade.escalated) detours.push(`cascade kept (${d.cascade.signal} ${d.cascade.score})`);
    const tr = el("tr", { "data-request-id": d.request_id, class: d.status >= 400 ? "failed" : "" },
      el("td", {}, clock(d.at)), el("td", {}, d.model), el("td", {}, `${d.profile} (${d.profile_source})`),
      el("td", {}, d.rule || "–"), el("td", {}, d.chain.join(" → ")), el("td", { "data-field": "tier" }, d.tier || "–"),
      el("td", {}, detours.join("; ") || "–"), el("td", {}, d.error ? `${d.status} ${d.error}` : String(d.status)),
      el("td", { class: "num" }, fmt(d.overhead_ms, 2)), el("td", { class: "num" }, fmt(d.total_ms, 1)));
    tr.title = d.reasons.join("; ");
    return tr;
  });
  $("#routing-table tbody").replaceChildren(...rows);
  $("#decisions-total").textContent = `${r.decisions_total} decisions since start; the last ${r.decisions.length} shown`;
}

function renderBreakers(b) {
  $("#breakers-scope").textContent = b.shared ? "(shared by every replica through Redis)" : "(this gateway)";
  $("#breakers-error").textContent = b.error || "";
  const rows = Object.entries(b.tiers).map(([name, s]) => {
    const state = s.state + (s.state === "open" ? ` (${s.open_for_s.toFixed(1)} s left)` : "");
    const history = el("ul", { class: "events" }, ...s.history.slice(0, 6).map((e) =>
      el("li", { "data-event": e.event }, `${clock(e.at)} ${e.event}: ${e.why}`)));
    return el("tr", { "data-breaker": name, "data-state": s.state },
      el("td", {}, name), el("td", {}, el("span", { class: "state", "data-state": s.state }, state)),
      el("td", {}, `${s.failures}/${s.calls} failed, ${s.slow} slow in ${s.window_s} s (opens at ${s.failure_rate} with ≥ ${s.min_calls})`),
      el("td", {}, `${s.probes_in_flight} in flight, ${s.probe_successes}/${s.half_open_probes} passed`),
      el("td", {}, history));
  });
  $("#breakers-table tbody").replaceChildren(...rows);
}

function used(n, limit, money) {
  const show = (v) => (money ? "$" + fmt(v, 4) : fmt(v));
  if (limit === null || limit === undefined) return show(n);
  return `${show(n)} / ${show(limit)} (${limit ? ((n / limit) * 100).toFixed(1) : "–"} %)`;
}

function renderBudgets(b) {
  $("#budgets-scope").textContent = !b.active ? "(no limits configured)" : b.shared ? "(shared through Redis)" : "(this gateway)";
  $("#budgets-error").textContent = b.error || "";
  const rows = b.scopes.map((s) => el("tr", { "data-scope": s.scope },
    el("td", {}, `${s.kind} ${s.id}`),
    el("td", { class: "num" }, used(s.used.tokens_day, s.limits.tokens_per_day)),
    el("td", { class: "num" }, used(s.used.tokens_month, s.limits.tokens_per_month)),
    el("td", { class: "num" }, used(s.used.cost_day, s.limits.cost_per_day, true)),
    el("td", { class: "num" }, used(s.used.cost_month, s.limits.cost_per_month, true)),
    el("td", { class: "num" }, used(s.in_flight, s.limits.max_concurrent)),
    el("td", {}, `rpm ${fmt(s.limits.rpm)} · tpm ${fmt(s.limits.tpm)}`),
    el("td", { class: "num" }, fmt(s.refusals))));
  $("#budgets-table tbody").replaceChildren(...rows);
  $("#refusals").replaceChildren(...b.recent_refusals.slice(0, 10).map((r) =>
    el("li", {}, `${clock(r.at)} ${r.scope}: ${r.kind}${r.degraded ? " (local limiter)" : ""} on ${r.replica}`)));
  if (!b.recent_refusals.length) $("#refusals").replaceChildren(el("li", { class: "note" }, "none"));
  $("#outages").replaceChildren(...b.outages.slice().reverse().map((o) => el("li", {},
    `${stamp(o.started)} → ${o.ended ? stamp(o.ended) : "ongoing"}: fail-${o.policy}, ` +
    `${o.degraded_admissions} admitted locally; ${o.error}`)));
  if (!b.outages.length) $("#outages").replaceChildren(el("li", { class: "note" }, "none"));
}

poll();
