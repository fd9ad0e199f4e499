// The fdbqueue dashboard: one page, routes after '#', data from the JSON API of
// fdbqueue/web/app.py. Text from the database is only ever set as text (never as HTML).
"use strict";

const $main = document.getElementById("main");
let timer = null;
let view = null; // the route being shown: { kind, queue, id, state, filter, after, ... }

// -- helpers ---------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const svgNS = "http://www.w3.org/2000/svg";
function s(tag, attrs) {
  const el = document.createElementNS(svgNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  return el;
}

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST",
    headers: { "content-type": "application/json", "x-fdbqueue": "1" },
    body: JSON.stringify(body),
  };
  const r = await fetch(path, init);
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (!r.ok && !(r.status === 404 && data && data.history)) {
    const err = new Error((data && data.error) || `${r.status} ${r.statusText}`);
    err.status = r.status;
    throw err;
  }
  return data;
}

function showError(text) {
  const el = document.getElementById("error");
  el.textContent = text || "";
  el.hidden = !text;
}

function num(n) { return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US"); }
function rate(r) { return r === null || r === undefined ? "–" : (r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString("en-US")); }
function age(sec) {
  if (sec === null || sec === undefined) return "–";
  if (sec < 1) return "<1s";
  if (sec < 90) return Math.round(sec) + "s";
  if (sec < 5400) return Math.round(sec / 60) + "m";
  if (sec < 172800) return (sec / 3600).toFixed(1) + "h";
  return Math.round(sec / 86400) + "d";
}
function when(t) { return t ? new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "–"; }
function qhref(q) { return "#/queue/" + encodeURIComponent(q); }
function mhref(q, id) { return qhref(q) + "/message/" + encodeURIComponent(id); }

function stateBadges(st) {
  const out = [];
  if (!st.enqueue_enabled) out.push(h("span", { class: "badge warn", "data-paused": "enqueue" }, "enqueue paused"));
  if (!st.dequeue_enabled) out.push(h("span", { class: "badge warn", "data-paused": "dequeue" }, "dequeue paused"));
  if (!out.length) out.push(h("span", { class: "badge ok" }, "active"));
  return out;
}

// -- the chart: depths and rates over the sampler's window, drawn as SVG ----------------------

const DEPTHS = [["ready", "var(--ready)"], ["inflight", "var(--inflight)"], ["delayed", "var(--delayed)"], ["errors", "var(--errors)"]];
const RATES = [["in_rate", "var(--in)"], ["done_rate", "var(--done)"]];

function chart(title, series, lines, id) {
  const W = 460, H = 150, P = 30;
  const svg = s("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}`, "data-points": series.length, id });
  let max = 1;
  for (const p of series) for (const [k] of lines) max = Math.max(max, p[k]);
  const t0 = series.length ? series[0].at : 0, t1 = series.length ? series[series.length - 1].at : 1;
  const x = (t) => P + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - P - 8);
  const y = (v) => H - 18 - (v / max) * (H - 40);
  svg.append(s("line", { x1: P, y1: H - 18, x2: W - 8, y2: H - 18, stroke: "#c8cdd8" }));
  const top = s("text", { x: 2, y: 14, "font-size": 11, fill: "#6b7385" });
  top.textContent = max >= 10 ? Math.round(max).toLocaleString("en-US") : max.toFixed(1);
  svg.append(top);
  const span = s("text", { x: P, y: H - 4, "font-size": 11, fill: "#6b7385" });
  span.textContent = series.length > 1 ? `last ${age(t1 - t0)}` : "collecting…";
  svg.append(span);
  for (const [k, color] of lines) {
    if (!series.length) continue;
    const pts = series.map((p) => `${x(p.at).toFixed(1)},${y(p[k]).toFixed(1)}`).join(" ");
    svg.append(s("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": 2, "data-line": k }));
  }
  const legend = h("div", { class: "legend" }, lines.map(([k, color]) =>
    h("span", {}, h("i", { style: `background:${color}` }), k.replace("_rate", "/s").replace("inflight", "in flight"))));
  return h("div", { class: "chart" }, h("div", {}, h("strong", {}, title)), svg, legend);
}

// -- routes ----------------------------------------------------------------------------------

function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  showError("");
  if (parts[0] === "workers") {
    view = { kind: "workers" };
  } else if (parts[0] === "queue" && parts[1] && parts[2] === "message" && parts[3]) {
    view = { kind: "message", queue: parts[1], id: parts[3] };
  } else if (parts[0] === "queue" && parts[1]) {
    view = { kind: "queue", queue: parts[1], state: "ready", filter: "", after: null, pages: [] };
  } else {
    view = { kind: "overview", filter: (view && view.kind === "overview") ? view.filter : "" };
  }
  crumbs();
  // The previous page goes at once, not when the new one's data comes back: its buttons act
  // on the previous queue, and a click in between would land on them.
  $main.replaceChildren(h("p", { class: "muted", id: "loading" }, "Loading…"));
  refresh(true);
}

function crumbs() {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren();
  nav.append(h("a", { href: "#/" }, "queues"));
  if (view.kind === "workers") nav.append("/", h("a", { href: "#/workers" }, "workers"));
  if (view.queue) nav.append("/", h("a", { href: qhref(view.queue) }, view.queue));
  if (view.id) nav.append("/", h("span", { class: "mono" }, view.id));
}

async function refresh(first) {
  clearTimeout(timer);
  const current = view;
  let next = 2000;
  try {
    if (current.kind === "overview") next = await overview(first);
    else if (current.kind === "workers") next = await workersPage(first);
    else if (current.kind === "queue") next = await queuePage(first);
    else next = await messagePage(first);
  } catch (e) {
    showError(e.message);
  }
  if (view === current && next) timer = setTimeout(() => refresh(false), next);
}

// -- the queues ------------------------------------------------------------------------------

async function overview(first) {
  const d = await api("api/overview");
  who(d);
  status(d);
  if (d.error) showError("Reading the queues failed: " + d.error);
  let filterBox = document.getElementById("queue-filter");
  if (first || !filterBox) {
    filterBox = h("input", { type: "search", id: "queue-filter", placeholder: "filter queues by name", value: view.filter,
      oninput: (e) => { view.filter = e.target.value; draw(); } });
    $main.replaceChildren(
      h("h1", {}, "Queues"),
      h("div", { class: "charts", id: "charts" }),
      h("div", { class: "toolbar" }, filterBox, h("span", { class: "muted", id: "queue-count" })),
      h("table", { id: "queues" },
        h("thead", {}, h("tr", {},
          h("th", {}, "Queue"), h("th", { class: "num" }, "Ready"), h("th", { class: "num" }, "In flight"),
          h("th", { class: "num" }, "Delayed"), h("th", { class: "num" }, "Dead letters"),
          h("th", { class: "num" }, "In/s"), h("th", { class: "num" }, "Done/s"),
          h("th", { class: "num" }, "Oldest"), h("th", {}, "State"))),
        h("tbody", {})));
  }
  const totals = d.series;
  document.getElementById("charts").replaceChildren(
    chart("Depth, all queues", totals, DEPTHS, "chart-depth"), chart("Rates, all queues", totals, RATES, "chart-rates"));
  view.data = d;
  draw();
  return Math.max(1000, d.interval * 1000);

  function draw() {
    const f = view.filter.toLowerCase();
    const rows = view.data.queues.filter((q) => q.name.toLowerCase().includes(f));
    document.getElementById("queue-count").textContent = `${rows.length} of ${view.data.queues.length} queues`;
    document.querySelector("#queues tbody").replaceChildren(...rows.map((q) =>
      h("tr", { class: "link", "data-queue": q.name, onclick: () => { location.hash = qhref(q.name); } },
        h("td", {}, h("a", { href: qhref(q.name) }, q.name)),
        h("td", { class: "num", "data-field": "ready" }, num(q.ready)),
        h("td", { class: "num", "data-field": "inflight" }, num(q.inflight)),
        h("td", { class: "num", "data-field": "delayed" }, num(q.delayed)),
        h("td", { class: "num", "data-field": "errors" }, num(q.errors)),
        h("td", { class: "num", "data-field": "ready_rate" }, rate(q.ready_rate)),
        h("td", { class: "num", "data-field": "done_rate" }, rate(q.done_rate)),
        h("td", { class: "num", "data-field": "oldest_age" }, age(q.oldest_age)),
        h("td", { "data-field": "state" }, stateBadges(q)))));
  }
}

// -- the workers (the registry: fdbqueue.workers) -------------------------------------------

async function workersPage(first) {
  const d = await api("api/workers");
  who(d);
  if (first || !document.getElementById("workers")) {
    $main.replaceChildren(
      h("h1", {}, "Workers"),
      h("p", { class: "muted", id: "worker-count" }),
      h("table", { id: "workers" },
        h("thead", {}, h("tr", {},
          h("th", {}, "Worker"), h("th", {}, "State"), h("th", {}, "Host"), h("th", { class: "num" }, "PID"),
          h("th", {}, "Queues"), h("th", { class: "num" }, "Up"), h("th", { class: "num" }, "Handled"),
          h("th", { class: "num" }, "Failed"), h("th", {}, "Current message"), h("th", { class: "num" }, "Since"))),
        h("tbody", {})));
  }
  const alive = d.workers.filter((w) => w.alive).length;
  document.getElementById("worker-count").textContent =
    `${d.workers.length} worker${d.workers.length === 1 ? "" : "s"}, ${alive} alive`;
  const rows = d.workers.map((w) => {
    const cur = w.current;
    const more = w.in_hand.length > 1 ? ` (+${w.in_hand.length - 1})` : "";
    return h("tr", { "data-worker": w.id },
      h("td", { class: "mono" }, w.id),
      h("td", { "data-field": "state" }, w.alive
        ? h("span", { class: "badge ok" }, "alive")
        : h("span", { class: "badge warn", title: "last seen " + when(w.last_seen) }, "dead")),
      h("td", { "data-field": "host" }, w.host),
      h("td", { class: "num", "data-field": "pid" }, String(w.pid)),
      h("td", { "data-field": "queues" }, w.queues.join(", ")),
      h("td", { class: "num", "data-field": "up" }, age(d.time - w.started)),
      h("td", { class: "num", "data-field": "handled" }, num(w.handled)),
      h("td", { class: "num", "data-field": "failed" }, num(w.failed)),
      h("td", { "data-field": "current" }, cur
        ? h("span", {}, h("a", { class: "mono", href: mhref(cur.queue, cur.id) }, cur.id), more)
        : "–"),
      h("td", { class: "num", "data-field": "since" }, cur ? age(d.time - cur.since) : "–"));
  });
  if (!rows.length) rows.push(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "no workers")));
  document.querySelector("#workers tbody").replaceChildren(...rows);
  return 1000;
}

function who(d) {
  document.getElementById("who").replaceChildren(
    "as ", h("strong", {}, d.principal), d.read_only ? h("span", { class: "badge warn", id: "read-only" }, "read-only") : "");
}

function status(d) {
  document.getElementById("status").textContent =
    `sampled ${when(d.sampled_at)} in ${Math.round(d.sample_seconds * 1000)} ms · every ${d.interval}s`;
}

// -- a queue ---------------------------------------------------------------------------------

// Rebuild a container's children only when what they show changed: a button replaced under the
// pointer between its mousedown and mouseup (the page refreshes every few hundred ms) would
// swallow the click.
function redraw(id, inputs, build) {
  const el = document.getElementById(id);
  const sig = JSON.stringify(inputs);
  if (el.dataset.sig === sig) return;
  el.dataset.sig = sig;
  el.replaceChildren(...build());
}

async function queuePage(first) {
  const q = view.queue;
  const [d, page] = await Promise.all([
    api("api/queue?name=" + encodeURIComponent(q)),
    api(`api/messages?queue=${encodeURIComponent(q)}&state=${view.state}&filter=${encodeURIComponent(view.filter)}` +
        (view.after ? "&after=" + view.after : "")),
  ]);
  if (view.kind !== "queue" || view.queue !== q) return 0;
  who(d);
  const st = d.stats;
  const canAct = d.admin && !d.read_only;
  const why = d.read_only ? "the dashboard is read-only" : (d.admin ? "" : "needs the admin right on this queue");
  if (first || !document.getElementById("queue-page")) {
    const filter = h("input", { type: "search", id: "message-filter", placeholder: "header=value or text", value: view.filter,
      onkeydown: (e) => { if (e.key === "Enter") { view.filter = e.target.value; view.after = null; view.pages = []; refresh(false); } } });
    $main.replaceChildren(h("div", { id: "queue-page" },
      h("h1", {}, q, " ", h("span", { id: "queue-state" })),
      h("div", { class: "cards", id: "cards" }),
      h("div", { class: "toolbar", id: "controls" }),
      h("div", { class: "charts", id: "charts" }),
      h("h2", {}, "Messages"),
      h("div", { class: "toolbar" },
        h("span", { class: "tabs" }, ["ready", "leased", "delayed"].map((name) =>
          h("button", { "data-state": name, class: view.state === name ? "on" : "",
            onclick: () => { view.state = name; view.after = null; view.pages = []; refresh(true); } }, name))),
        filter,
        h("button", { id: "apply-filter", onclick: () => { view.filter = filter.value; view.after = null; view.pages = []; refresh(false); } }, "Filter"),
        h("span", { id: "bulk" })),
      h("div", { id: "messages" }),
      h("div", { class: "toolbar", id: "pager" })));
  }
  document.getElementById("queue-state").replaceChildren(...stateBadges(st));
  document.getElementById("cards").replaceChildren(...[
    ["ready", st.ready], ["in flight", st.inflight], ["delayed", st.delayed], ["dead letters", st.errors],
    ["in/s", rate(st.ready_rate)], ["done/s", rate(st.done_rate)], ["oldest", age(st.oldest_age)],
    ["consumed", st.done], ["dead-lettered", st.dead], ["expired", st.expired],
  ].map(([k, v]) => h("div", { class: "card", "data-card": k }, h("div", { class: "v" }, typeof v === "number" ? num(v) : v), h("div", { class: "k" }, k))));
  const paused = d.paused;
  const toggle = (direction, isPaused) => h("button", {
    id: `${isPaused ? "resume" : "pause"}-${direction}`, disabled: !canAct, title: why || null,
    onclick: () => act("api/pause", { queue: q, direction, paused: !isPaused }),
  }, `${isPaused ? "Resume" : "Pause"} ${direction}`);
  redraw("controls", [paused, canAct, why, d.error_queue, d.owner, d.settings.journal], () => [
    toggle("enqueue", paused.enqueue), toggle("dequeue", paused.dequeue),
    h("span", { class: "muted" }, `dead letters go to `, h("a", { href: qhref(d.error_queue) }, d.error_queue),
      d.owner ? ` · owner ${d.owner}` : " · open to every principal", d.settings.journal ? " · journaled" : ""),
    why ? h("span", { class: "badge", id: "why-disabled" }, why) : ""]);
  document.getElementById("charts").replaceChildren(
    chart("Depth", d.series, DEPTHS, "chart-depth"), chart("Rates", d.series, RATES, "chart-rates"));
  const dead = page.messages.some((m) => m.origin);
  redraw("bulk", [dead, canAct, why, q, view.filter], () => [dead ? h("button", {
    id: "redrive-all", disabled: !canAct, title: why || null,
    onclick: () => confirm(`Redrive every dead letter of ${q}${view.filter ? " matching " + view.filter : ""}?`) &&
      act("api/redrive", { queue: q, filter: view.filter }),
  }, view.filter ? "Redrive matching" : "Redrive all") : ""]);
  // Ages change every refresh: the rows (and their buttons) are rebuilt only when something
  // else did; otherwise their age cells are updated in place.
  const still = page.messages.map(({ age: _, ...rest }) => rest);
  redraw("messages", [q, still, canAct, why, view.filter], () => [messageTable(q, page.messages, canAct, why)]);
  for (const m of page.messages) {
    const cell = document.querySelector(`#message-list tr[data-id="${CSS.escape(m.id)}"] td[data-age]`);
    if (cell) cell.textContent = age(m.age);
  }
  const pager = document.getElementById("pager");
  pager.replaceChildren(
    h("span", { class: "muted", id: "page-info" }, `${page.messages.length} shown · ${page.scanned} read`),
    view.pages.length ? h("button", { id: "prev-page", onclick: () => { view.after = view.pages.pop(); refresh(false); } }, "◀ Previous") : "",
    page.next ? h("button", { id: "next-page", onclick: () => { view.pages.push(view.after); view.after = page.next; refresh(false); } }, "Next ▶") : "");
  document.getElementById("status").textContent = `updated ${when(Date.now() / 1000)} · every 2s`;
  return 2000;
}

function messageTable(q, msgs, canAct, why) {
  if (!msgs.length) return h("p", { class: "muted", id: "no-messages" }, "No messages here" + (view.filter ? " match the filter." : "."));
  return h("table", { id: "message-list" },
    h("thead", {}, h("tr", {}, h("th", {}, "Id"), h("th", { class: "num" }, "Priority"), h("th", { class: "num" }, "Deliveries"),
      h("th", { class: "num" }, "Age"), h("th", {}, "Headers"), h("th", {}, "Payload"), h("th", {}, "Reason"), h("th", {}, ""))),
    h("tbody", {}, msgs.map((m) => m.id === null
      ? h("tr", {}, h("td", { colspan: 8, class: "muted" }, "damaged record: " + m.damaged))
      : h("tr", { "data-id": m.id },
        h("td", { class: "mono" }, h("a", { href: mhref(q, m.id) }, m.id)),
        h("td", { class: "num" }, m.priority), h("td", { class: "num" }, m.deliveries), h("td", { class: "num", "data-age": "" }, age(m.age)),
        h("td", { class: "mono" }, Object.entries(m.headers).map(([k, v]) => `${k}=${v}`).join(" ")),
        h("td", { class: "mono preview" }, m.preview === null ? `(${m.content_type}, in chunks)` : m.preview),
        h("td", {}, m.reason || "", m.origin ? h("span", { class: "muted" }, ` from ${m.origin}`) : ""),
        h("td", {}, actions(q, m, canAct, why))))));
}

function actions(q, m, canAct, why) {
  return [
    m.origin && m.state === "ready" ? h("button", { "data-action": "redrive", disabled: !canAct, title: why || null,
      onclick: (e) => { e.stopPropagation(); act("api/redrive", { queue: q, ids: [m.id] }); } }, "Retry") : "",
    " ",
    h("button", { class: "danger", "data-action": "delete", disabled: !canAct, title: why || null,
      onclick: (e) => { e.stopPropagation(); if (confirm(`Delete message ${m.id}?`)) act("api/delete", { queue: q, ids: [m.id] }); } }, "Delete"),
  ];
}

async function act(path, body) {
  try {
    const r = await api(path, body);
    showError("");
    const done = h("span", { class: "badge ok", id: "acted" },
      r.redriven !== undefined ? `${r.redriven} redriven` : r.deleted !== undefined ? `${r.deleted} deleted` : "done");
    if (view.kind === "message" && (r.redriven || r.deleted)) { location.hash = qhref(view.queue); return; }
    await refresh(false);
    const bar = document.getElementById("controls") || document.getElementById("detail-actions");
    document.getElementById("acted")?.remove();  // controls now outlive a refresh: one at a time
    if (bar) bar.append(done);
  } catch (e) {
    showError(e.message);
  }
}

// -- a message -------------------------------------------------------------------------------

async function messagePage() {
  const d = await api(`api/message?queue=${encodeURIComponent(view.queue)}&id=${encodeURIComponent(view.id)}`);
  const q = await api("api/queue?name=" + encodeURIComponent(view.queue));
  who(q);
  const canAct = q.admin && !q.read_only;
  const why = q.read_only ? "the dashboard is read-only" : (q.admin ? "" : "needs the admin right on this queue");
  const rows = [];
  const field = (k, v) => rows.push(h("dt", {}, k), h("dd", { "data-field": k }, v));
  field("state", d.state || "gone (no longer in this queue)");
  if (d.damaged) field("damaged", d.damaged + " (a sweep or a consumer moves it to the error queue)");
  else if (d.state) {
    field("priority", d.priority); field("deliveries", d.deliveries); field("enqueued", when(d.enqueued_at));
    field("content type", d.content_type); field("size", num(d.size) + " bytes");
    if (d.expires_at) field("expires", when(d.expires_at));
    if (d.lease_until) field("lease until", when(d.lease_until));
    if (d.reason) field("reason", d.reason);
    if (d.origin) field("origin", d.origin);
    field("headers", Object.entries(d.headers).map(([k, v]) => `${k}=${v}`).join("  ") || "–");
  }
  $main.replaceChildren(
    h("h1", {}, "Message ", h("span", { class: "mono" }, d.id)),
    h("dl", { class: "kv", id: "message-fields" }, rows),
    h("div", { class: "toolbar", id: "detail-actions" }, d.state ? actions(view.queue, d, canAct, why) : ""),
    ...(d.state ? [h("h2", {}, "Payload" + (d.truncated ? " (first 64 KiB)" : "")), h("pre", { id: "payload" }, d.preview)] : []),
    h("h2", {}, "Journal"),
    d.history.length ? h("table", { id: "history" },
      h("thead", {}, h("tr", {}, h("th", {}, "At"), h("th", {}, "Op"), h("th", {}, "Queue"), h("th", {}, "Principal"),
        h("th", { class: "num" }, "Deliveries"), h("th", {}, "Reason"), h("th", {}, "Details"))),
      h("tbody", {}, d.history.map((e) => h("tr", { "data-op": e.op },
        h("td", {}, when(e.at)), h("td", {}, e.op), h("td", {}, e.queue), h("td", {}, e.principal),
        h("td", { class: "num" }, e.deliveries), h("td", {}, e.reason || ""),
        h("td", { class: "mono" }, Object.keys(e.details).length ? JSON.stringify(e.details) : "")))))
      : h("p", { class: "muted", id: "no-history" }, d.journal ? "No journal entries." : "This queue keeps no journal (create_queue(..., journal=True))."));
  return 0; // a message's page is not refreshed by itself
}

window.addEventListener("hashchange", route);
route();
