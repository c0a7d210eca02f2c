// Leasecast dashboard: draws what /ws/dashboard/ sends: the gateway's 15 minutes
// of rate history once, then a snapshot every second. Plain JavaScript and SVG,
// no build step, no library (docs/dashboard.md says why). Every value from the
// server is inserted as text (textContent, setAttribute), never as HTML: queue
// names, topics, clients and message bodies are data.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PAGE = 50; // rows per table page: 1,000 sockets draw 50 rows, not 1,000
const QUEUE_SERIES = ["enqueued", "acked", "redelivered", "dead_lettered"];
const TOPIC_SERIES = ["published", "delivered", "dropped"];
const HEAT_ROWS = 40; // consumers shown in the heatmap, worst first
// What this user may do (the page shows no control it cannot use; the API
// refuses them anyway): gateway.change_queue, publishing, and whether the
// gateway has the queue's cancel endpoint.
const CAN_CHANGE = document.body.hasAttribute("data-can-change");
const CAN_PUBLISH = document.body.hasAttribute("data-can-publish");
const CANCEL_AVAILABLE = document.body.hasAttribute("data-cancel-available");

const state = {
  bucket: 5,
  keep: 180,
  samples: [], // [{t, queues: {q: [4]}, topics: {t: [3]}, consumers: {key: ratio}}], oldest first
  labels: {}, // consumer key -> {process, socket, topic, client, policy}
  snapshot: null,
  pages: { queues: 0, topics: 0, sockets: 0, tasks: 0, workers: 0 },
  tasks: { status: "", name: "", page: null, seq: 0 },
  browser: { queue: null, state: "visible", after: null, pageNo: 1, messages: [] },
};
// Scripting time of each render (ms), newest last: the browser tests and
// bench read it (docs/benchmarks.md).
window.leasecastRenderTimes = [];
window.leasecastFrameTimes = [];
let socket = null;

// -- small helpers ---------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  return node;
}

function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

// One formatter per precision: toLocaleString with options builds a new
// Intl.NumberFormat per call, which was most of a 1,000-socket update.
const formats = {};

function num(value, digits = 0) {
  const format = (formats[digits] ||= new Intl.NumberFormat(undefined, { maximumFractionDigits: digits }));
  return format.format(Number(value || 0));
}

function rate(value) {
  const v = Number(value || 0);
  return num(v, v < 10 ? 1 : 0);
}

function maybe(value, format = num) {
  if (value === null || value === undefined) return "—";
  return typeof value === "number" ? format(value) : String(value);
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n)}…` : text;
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

async function api(method, path, data) {
  const headers = { "X-CSRFToken": csrfToken() };
  if (data !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: data === undefined ? undefined : JSON.stringify(data),
  });
  let body = {};
  try { body = await response.json(); } catch (e) { body = { error: "bad_response", detail: String(e) }; }
  return { status: response.status, ok: response.ok, body };
}

function queuePath(queue) {
  return `/api/queues/${encodeURIComponent(queue)}`;
}

// -- history ---------------------------------------------------------------------

function addSamples(samples) {
  for (const sample of samples) {
    const last = state.samples[state.samples.length - 1];
    if (last && last.t === sample.t) state.samples[state.samples.length - 1] = sample;
    else if (!last || sample.t > last.t) state.samples.push(sample);
  }
  const newest = state.samples.length ? state.samples[state.samples.length - 1].t : 0;
  const oldest = newest - state.keep * state.bucket;
  while (state.samples.length && state.samples[0].t <= oldest) state.samples.shift();
}

function seriesOf(kind, name, index) {
  // One series' values, oldest first: a single queue/topic, or the sum of all.
  return state.samples.map((s) => {
    const rows = s[kind] || {};
    if (name) return (rows[name] || [])[index] || 0;
    let total = 0;
    for (const values of Object.values(rows)) total += values[index] || 0;
    return total;
  });
}

function settled() {
  // The sample the "now" figures show: the newest once it has seen 3 seconds,
  // else the one before (a sample a second old swings with every burst).
  const n = state.samples.length;
  const last = state.samples[n - 1];
  return last && last.seconds !== undefined && last.seconds < 3 && n > 1 ? state.samples[n - 2] : last;
}

function windowStart() {
  const newest = state.samples.length ? state.samples[state.samples.length - 1].t : Date.now() / 1000;
  return newest - (state.keep - 1) * state.bucket;
}

function polylinePoints(values, times, width, height, max) {
  const start = windowStart();
  const span = (state.keep - 1) * state.bucket;
  return values.map((v, i) => {
    const x = ((times[i] - start) / span) * width;
    const y = height - 1 - (v / max) * (height - 4);
    return `${x.toFixed(1)},${y.toFixed(1)}`;
  }).join(" ");
}

function drawChart(svg, values) {
  const width = svg.clientWidth || 240;
  const height = svg.clientHeight || 64;
  const times = state.samples.map((s) => s.t);
  const max = Math.max(1, ...values);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  let line = svg.querySelector("polyline");
  let top = svg.querySelector("text.max");
  if (!line) {
    svg.append(svgEl("line", { class: "axis", x1: 0, x2: width, y1: height - 0.5, y2: height - 0.5 }));
    line = svgEl("polyline");
    top = svgEl("text", { class: "max", x: 2, y: 10 });
    svg.append(line, top);
  }
  line.setAttribute("points", polylinePoints(values, times, width, height, max));
  setText(top, `max ${rate(max)}`);
  svg.dataset.points = String(values.length);
}

function renderCharts() {
  const queue = document.getElementById("focus-queue").value;
  const topic = document.getElementById("focus-topic").value;
  for (const figure of document.querySelectorAll(".chart-grid figure")) {
    const key = figure.dataset.series;
    const values = QUEUE_SERIES.includes(key)
      ? seriesOf("queues", queue, QUEUE_SERIES.indexOf(key))
      : seriesOf("topics", topic, TOPIC_SERIES.indexOf(key));
    drawChart(figure.querySelector("svg"), values);
    const at = state.samples.indexOf(settled());
    setText(figure.querySelector(".now"), rate(values[at] || 0));
  }
}

const optionNames = new WeakMap(); // select -> Set of the names it offers

function syncOptions(select, names) {
  let have = optionNames.get(select);
  if (!have) optionNames.set(select, (have = new Set([...select.options].map((o) => o.value))));
  for (const name of names) {
    if (!have.has(name)) {
      have.add(name);
      select.append(el("option", { value: name }, name));
    }
  }
}

// -- keyed tables: rows are kept and updated in place, so focus survives ticks --

const rowCache = new WeakMap(); // tbody -> Map(key -> tr)

function syncRows(tbody, items, keyOf, build, update) {
  let rows = rowCache.get(tbody);
  if (!rows) rowCache.set(tbody, (rows = new Map()));
  const wanted = new Map();
  for (const item of items) {
    const key = keyOf(item);
    let row = rows.get(key);
    if (!row) row = build(item);
    row.item = item;
    update(row, item);
    wanted.set(key, row);
  }
  for (const [key, row] of rows) if (!wanted.has(key)) row.remove();
  rowCache.set(tbody, wanted);
  // Re-append only what is out of place: moving the focused row would blur it.
  let at = tbody.firstElementChild;
  for (const row of wanted.values()) {
    if (row === at) at = at.nextElementSibling;
    else tbody.insertBefore(row, at);
  }
}

function pager(name, total, onChange) {
  const box = document.querySelector(`.pager[data-table="${name}"]`);
  const pages = Math.max(1, Math.ceil(total / PAGE));
  state.pages[name] = Math.min(state.pages[name], pages - 1);
  if (!box.firstChild) {
    const prev = el("button", { type: "button", class: "prev", "aria-label": `previous page of ${name}` }, "‹");
    const next = el("button", { type: "button", class: "next", "aria-label": `next page of ${name}` }, "›");
    prev.addEventListener("click", () => { state.pages[name] = Math.max(0, state.pages[name] - 1); onChange(); });
    next.addEventListener("click", () => { state.pages[name] += 1; onChange(); });
    box.append(prev, el("span", { class: "where" }), next);
  }
  setText(box.querySelector(".where"), `${state.pages[name] + 1} / ${pages}`);
  box.querySelector(".prev").disabled = state.pages[name] === 0;
  box.querySelector(".next").disabled = state.pages[name] >= pages - 1;
  box.hidden = pages === 1;
  return state.pages[name] * PAGE;
}

// -- alerts and heatmap -----------------------------------------------------------

function renderAlerts(snapshot) {
  const list = snapshot.alerts || [];
  setText(document.getElementById("alert-count"), list.length);
  document.getElementById("alert-count").classList.toggle("bad", list.length > 0);
  setText(document.getElementById("oldest-threshold"), ago(snapshot.oldest_alert));
  // Keyed like the tables: 200 stale queues update two texts each, not 200 new items.
  const ul = document.getElementById("alerts");
  syncRows(ul, list.length ? list : [{ kind: "none" }],
    (a) => (a.kind === "consumer" ? `c:${a.consumer}` : a.kind === "queue" ? `q:${a.queue}` : "none"),
    (a) => {
      if (a.kind === "consumer") {
        return el("li", { class: "alert consumer", "data-consumer": a.consumer, "data-topic": a.topic || "" },
          el("b", {}), " by a ", el("code", {}, a.policy || ""), " subscriber of ", el("code", {}, a.topic || ""),
          ` (${a.client}, socket ${a.socket} on `, el("span", { class: "tag" }, a.process), ")");
      }
      if (a.kind === "queue") {
        return el("li", { class: "alert queue", "data-queue": a.queue },
          el("b", {}), " in ", el("code", {}, a.queue), el("span", {}));
      }
      return el("li", { class: "muted" }, "No alert.");
    },
    (li, a) => {
      if (a.kind === "consumer") setText(li.firstChild, `${num(a.drop_ratio * 100, 1)}% dropped`);
      else if (a.kind === "queue") {
        setText(li.firstChild, `oldest visible ${ago(a.oldest_visible_age)}`);
        setText(li.lastChild, ` (${num(a.visible)} visible)`);
      }
    });
}

function heatLevel(ratio) {
  if (ratio <= 0) return 0;
  if (ratio <= 0.01) return 1;
  if (ratio <= 0.1) return 2;
  if (ratio <= 0.5) return 3;
  return 4;
}

function renderHeatmap() {
  // Rows: connected subscribers (the server's labels) that dropped in the window.
  // Samples hold only consumers that dropped, so this walks the drops, not
  // every subscriber times every sample.
  const byKey = new Map();
  for (const s of state.samples) {
    for (const [key, ratio] of Object.entries(s.consumers || {})) {
      const label = state.labels[key];
      if (!label || ratio <= 0) continue;
      let row = byKey.get(key);
      if (!row) byKey.set(key, (row = { key, label, cells: [], worst: 0, now: 0 }));
      row.cells.push([s.t, ratio]);
      row.worst = Math.max(row.worst, ratio);
    }
  }
  const last = state.samples[state.samples.length - 1];
  for (const row of byKey.values()) row.now = last ? (last.consumers || {})[row.key] || 0 : 0;
  const rows = [...byKey.values()];
  rows.sort((a, b) => b.now - a.now || b.worst - a.worst);
  const shown = rows.slice(0, HEAT_ROWS);
  document.getElementById("heatmap-empty").hidden = rows.length > 0;
  const start = windowStart();
  const span = state.keep * state.bucket;
  syncRows(document.querySelector("#heatmap tbody"), shown, (r) => r.key,
    (r) => {
      const svg = svgEl("svg", { class: "heat", viewBox: "0 0 1000 10", preserveAspectRatio: "none" });
      return el("tr", { tabindex: "0", "data-consumer": r.key },
        el("th", { scope: "row" }), el("td", { class: "cells" }, svg), el("td", { class: "num" }));
    },
    (tr, r) => {
      const l = r.label;
      setText(tr.cells[0], `${l.topic} · ${l.policy} · ${l.client} · ${l.process}/${l.socket}`);
      tr.setAttribute("aria-label", `${l.topic}, ${l.client}: ${num(r.now * 100, 1)}% dropped now, worst ${num(r.worst * 100, 1)}%`);
      const svg = tr.cells[1].firstChild;
      const rects = r.cells.map(([t, ratio]) => svgEl("rect", {
        x: (((t - start) / span) * 1000).toFixed(1), y: 0,
        width: ((state.bucket / span) * 1000).toFixed(1), height: 10,
        class: `level${heatLevel(ratio)}`,
      }));
      svg.replaceChildren(...rects);
      setText(tr.cells[2], `${num(r.now * 100, 1)}%`);
    });
}

// -- queues -----------------------------------------------------------------------

function queueRates(name) {
  const last = settled();
  return (last && last.queues && last.queues[name]) || [0, 0, 0, 0];
}

function miniSpark(svg, values) {
  // Redrawn only when a sample was added or changed: most seconds, for most rows, none did.
  const last = state.samples[state.samples.length - 1];
  const stamp = `${values.length}:${last ? last.t : 0}:${values[values.length - 1]}`;
  if (svg.dataset.stamp === stamp) return;
  svg.dataset.stamp = stamp;
  const max = Math.max(1, ...values);
  let line = svg.firstChild;
  if (!line) svg.append((line = svgEl("polyline")));
  line.setAttribute("points", polylinePoints(values, state.samples.map((s) => s.t), 100, 20, max));
}

function renderQueues(snapshot) {
  const all = Array.isArray(snapshot.queues) ? snapshot.queues : [];
  syncOptions(document.getElementById("focus-queue"), all.map((q) => q.name));
  const filter = document.getElementById("queue-filter").value.trim().toLowerCase();
  const queues = filter ? all.filter((q) => q.name.toLowerCase().includes(filter)) : all;
  setText(document.getElementById("queue-count"), queues.length === all.length ? all.length : `${queues.length} of ${all.length}`);
  const from = pager("queues", queues.length, renderAll);
  syncRows(document.querySelector("#queues tbody"), queues.slice(from, from + PAGE), (q) => q.name,
    (q) => {
      const tr = el("tr", { tabindex: "0", "data-queue": q.name, title: "Enter: browse its messages" },
        el("td", { class: "name" }, el("span", {}, q.name), el("span", { class: "limits muted" })),
        el("td", { class: "num visible" }), el("td", { class: "num" }), el("td", { class: "num" }),
        el("td", { class: "num dead" }),
        el("td", {}, svgEl("svg", { class: "spark", viewBox: "0 0 100 20", preserveAspectRatio: "none" })),
        el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "num" }),
        el("td", { class: "num" }),
        el("td", { class: "actions" }, el("span", { class: "buttons" },
          el("button", { type: "button", class: "browse" }, "browse"))));
      if (CAN_CHANGE) {
        const buttons = tr.querySelector(".buttons");
        buttons.append(
          el("button", { type: "button", class: "pause", onclick: () => togglePause(tr.item) }, "pause"),
          el("button", { type: "button", class: "danger purge", onclick: () => queueAction(tr.item.name, "purge") }, "purge"),
          el("button", { type: "button", class: "redrive", onclick: () => queueAction(tr.item.name, "redrive") }, "redrive"));
      }
      tr.querySelector(".browse").addEventListener("click", () => openBrowser(tr.item.name));
      tr.addEventListener("keydown", (event) => {
        if (event.key === "Enter" && event.target === tr) openBrowser(tr.item.name);
      });
      return tr;
    },
    (tr, q) => {
      const rates = queueRates(q.name);
      const c = tr.cells;
      setText(c[1], num(q.visible)); setText(c[2], num(q.delayed)); setText(c[3], num(q.in_flight));
      setText(c[4], num(q.dead));
      miniSpark(c[5].firstChild, seriesOf("queues", q.name, 0));  // 50 rows a page, not 200
      for (let i = 0; i < 4; i++) setText(c[6 + i], rate(rates[i]));
      setText(c[10], ago(q.oldest_visible_age));
      const old = (q.oldest_visible_age || 0) > (snapshot.oldest_alert || Infinity);
      tr.classList.toggle("hot", old);
      setText(c[0].lastChild, queueLimits(q));
      tr.classList.toggle("paused", q.paused === true);
      const pause = tr.querySelector("button.pause");
      if (pause) {
        // A gateway whose queue document has no "paused" cannot pause: say so.
        const known = typeof q.paused === "boolean";
        pause.disabled = !known;
        setText(pause, q.paused ? "resume" : "pause");
        pause.title = known ? "" : "pause is not available on this gateway";
      }
    });
}

function queueLimits(q) {
  // Paused, and the limits that are set (0 is none): shown under the name.
  const parts = [];
  if (q.paused) parts.push("paused");
  if (q.max_in_flight) parts.push(`max ${num(q.max_in_flight)} in flight`);
  if (q.rate_limit) parts.push(`${num(q.rate_limit, 2)}/s${q.rate_burst ? ` (burst ${num(q.rate_burst)})` : ""}`);
  return parts.join(" · ");
}

async function togglePause(q) {
  const paused = !q.paused;
  const what = paused
    ? `Pause "${q.name}"? Its workers stay connected but get no new message until it is resumed.`
    : `Resume "${q.name}"?`;
  if (!window.confirm(what)) return;
  const { ok, body } = await api("PATCH", queuePath(q.name), { paused });
  if (!ok) window.alert(`${paused ? "Pause" : "Resume"} of ${q.name} failed: ${body.error}: ${body.detail}`);
  else q.paused = body.paused;  // the next snapshot says the same
  renderAll();
}

async function queueAction(queue, action) {
  const verb = action === "purge" ? "Purge every message not in flight from" : "Redrive every dead message of";
  if (!window.confirm(`${verb} "${queue}"?`)) return;
  const { ok, body } = await api("POST", `${queuePath(queue)}/${action}`);
  const text = ok
    ? action === "purge" ? `Purged ${body.purged} messages from ${queue}.` : `Redrove ${body.redriven} dead messages of ${queue}.`
    : `${action} of ${queue} failed: ${body.error}: ${body.detail}`;
  if (state.browser.queue === queue) { notice(text, ok ? "ok" : "bad"); loadMessages(); }
  else if (!ok) window.alert(text);
}

// -- message browser -----------------------------------------------------------------

function notice(text, kind = "ok") {
  const p = document.getElementById("browser-notice");
  p.className = `notice ${kind}`;
  p.textContent = text;
}

function openBrowser(queue) {
  const b = state.browser;
  if (b.queue !== queue) Object.assign(b, { queue, state: "visible", after: null, pageNo: 1 });
  const section = document.getElementById("browser");
  section.hidden = false;
  setText(document.getElementById("browser-queue"), queue);
  document.getElementById("browser-tasks").href =
    `${document.body.dataset.tasksUrl}?q=${encodeURIComponent(queue)}`;
  notice("");
  loadMessages().then(() => section.scrollIntoView({ block: "start" }));
  document.getElementById("browser-states").querySelector(`[data-state="${b.state}"]`).focus();
}

function browseUrl(limit = PAGE) {
  const b = state.browser;
  const after = b.after ? `&after=${encodeURIComponent(b.after)}` : "";
  return `${queuePath(b.queue)}/messages?state=${b.state}&limit=${limit}${after}`;
}

async function loadMessages() {
  const b = state.browser;
  if (!b.queue) return;
  for (const button of document.querySelectorAll("#browser-states button")) {
    button.setAttribute("aria-pressed", String(button.dataset.state === b.state));
  }
  // A slower answer to an earlier click (another state, queue or page) must
  // not replace the list just asked for.
  const seq = (b.seq = (b.seq || 0) + 1);
  const { ok, body } = await api("GET", browseUrl());
  if (seq !== b.seq) return;
  if (!ok) {
    b.messages = [];
    notice(`Could not list ${b.queue}: ${body.error}: ${body.detail}`, "bad");
  } else {
    b.messages = body.messages;
    b.next = body.next;
  }
  document.getElementById("browser-next").disabled = !b.next;
  document.getElementById("browser-first").disabled = !b.after;
  setText(document.getElementById("browser-page"),
    `page ${b.pageNo}: ${b.messages.length} ${b.state.replace("_", " ")} message${b.messages.length === 1 ? "" : "s"}`);
  const rows = b.messages.map((m) => {
    const body = JSON.stringify(m.body);
    const short = clip(body, 160);
    const buttons = el("span", { class: "buttons" });
    if (CAN_CHANGE && (m.state === "dead" || m.state === "in_flight")) {
      buttons.append(el("button", { type: "button", class: "requeue", onclick: () => messageAction("requeue", m) }, "requeue"));
    }
    if (CAN_CHANGE) {
      buttons.append(el("button", { type: "button", class: "danger delete", onclick: () => messageAction("delete", m) }, "delete"));
    }
    const actions = el("td", { class: "actions" }, buttons);
    const timed = m.visible_in !== null ? `in ${ago(Math.max(0, m.visible_in))}` : m.expires_in !== null ? `expires ${ago(m.expires_in)}` : "—";
    return el("tr", { "data-id": m.id, "data-state": m.state },
      el("td", { class: "num" }, m.id),
      el("td", { class: "body" }, el("code", { title: body.slice(0, 4000) }, short)),
      el("td", { class: "group", title: m.group || "" }, m.group === null ? "—" : clip(m.group, 40)),
      el("td", { class: "num" }, m.priority),
      el("td", { class: "num" }, m.deliveries),
      el("td", { class: "reason" }, m.dead_reason || "—"),
      el("td", { class: "num" }, ago(Date.now() / 1000 - m.enqueued_at)),
      el("td", { class: "num" }, timed),
      actions);
  });
  if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: "9", class: "muted" }, "No message in this state.")));
  document.querySelector("#messages tbody").replaceChildren(...rows);
}

async function messageAction(action, message) {
  const b = state.browser;
  const queue = b.queue;
  const what = action === "requeue"
    ? `Requeue message ${message.id} of "${queue}" (its delivery count is reset)?`
    : `Delete message ${message.id} of "${queue}" for good?`;
  if (!window.confirm(what)) return;
  // Act only on the message as the page showed it: the store checks, in the
  // action's own transaction, that it is still in the state shown, with the
  // same delivery count and the same lease (visible_at), and otherwise changes
  // nothing ({"requeued": 0} / {"deleted": 0}); 404 if it is gone.
  const listed = new URLSearchParams({
    if_state: message.state,
    if_deliveries: String(message.deliveries),
    if_visible_at: String(message.visible_at),
  });
  const path = `${queuePath(queue)}/messages/${encodeURIComponent(message.id)}`;
  const { status, ok, body } = action === "requeue"
    ? await api("POST", `${path}/requeue?${listed}`)
    : await api("DELETE", `${path}?${listed}`);
  if (status === 404) {
    notice(`Message ${message.id} is gone from ${queue} (acked or deleted meanwhile). Nothing was changed.`, "warn");
  } else if (!ok) {
    notice(`${action} of message ${message.id} failed: ${body.error}: ${body.detail}`, "bad");
  } else if ((action === "requeue" ? body.requeued : body.deleted) === 0) {
    notice(`Message ${message.id} is no longer ${message.state.replace("_", " ")} as listed: a worker or another operator moved it (acked, leased, requeued or deleted). Nothing was changed.`, "warn");
  } else {
    notice(action === "requeue" ? `Requeued message ${message.id}: it is visible again.` : `Deleted message ${message.id}.`, "ok");
  }
  return loadMessages();
}

function setupBrowser() {
  for (const button of document.querySelectorAll("#browser-states button")) {
    button.addEventListener("click", () => {
      Object.assign(state.browser, { state: button.dataset.state, after: null, pageNo: 1 });
      notice("");
      loadMessages();
    });
  }
  document.getElementById("browser-refresh").addEventListener("click", () => loadMessages());
  document.getElementById("browser-redrive")?.addEventListener("click", () => queueAction(state.browser.queue, "redrive"));
  document.getElementById("browser-close").addEventListener("click", () => {
    document.getElementById("browser").hidden = true;
    state.browser.queue = null;
  });
  document.getElementById("browser-next").addEventListener("click", () => {
    Object.assign(state.browser, { after: state.browser.next, pageNo: state.browser.pageNo + 1 });
    loadMessages();
  });
  document.getElementById("browser-first").addEventListener("click", () => {
    Object.assign(state.browser, { after: null, pageNo: 1 });
    loadMessages();
  });
}

// -- topics and sockets ------------------------------------------------------------

function renderTopics(snapshot) {
  const rows = [];
  for (const process of snapshot.processes) {
    for (const t of process.topics) rows.push({ ...t, process: process.name });
  }
  syncOptions(document.getElementById("focus-topic"), [...new Set(rows.map((t) => t.name))]);
  setText(document.getElementById("topic-count"), rows.length);
  const from = pager("topics", rows.length, renderAll);
  syncRows(document.querySelector("#topics tbody"), rows.slice(from, from + PAGE), (t) => `${t.process}\u0000${t.name}`,
    (t) => el("tr", { tabindex: "0", "data-topic": t.name },
      el("td", { class: "name" }, t.name), el("td", {}, el("span", { class: "tag" }, t.process)),
      ...Array.from({ length: 8 }, () => el("td", { class: "num" }))),
    (tr, t) => {
      const c = tr.cells;
      setText(c[2], num(t.subscribers)); setText(c[3], maybe(t.published)); setText(c[4], rate(t.publish_rate));
      setText(c[5], num(t.dropped)); setText(c[6], maybe(t.offset)); setText(c[7], maybe(t.epoch));
      setText(c[8], maybe(t.history_size)); setText(c[9], maybe(t.history_ttl, (v) => `${num(v, 1)} s`));
    });
}

function socketRows(snapshot) {
  const kind = document.getElementById("socket-kind").value;
  const filter = document.getElementById("socket-filter").value.trim().toLowerCase();
  const rows = [];
  for (const process of snapshot.processes) {
    for (const s of process.sockets) {
      if (kind ? s.kind !== kind : s.kind === "dashboard") continue;
      // A multiplexed socket (/ws/) is named by its topics and counted as their sum.
      const subs = s.kind === "multiplex" ? (s.topics || []).filter((t) => t.state !== "starting") : null;
      const name = subs ? subs.map((t) => t.topic).join(", ") : s.queue || s.topic || "";
      if (subs) {
        for (const key of ["delivered", "dropped", "rate", "drop_rate"]) s[key] = subs.reduce((n, t) => n + (t[key] || 0), 0);
      }
      if (filter && ![name, s.client, s.principal || ""].some((v) => String(v).toLowerCase().includes(filter))) continue;
      s.process = process.name;  // the frame's own objects: no copy of 1,000 sockets
      s.name = name;
      s.ratio = s.kind === "subscriber" || s.kind === "sse" || subs ? s.drop_rate / ((s.rate + s.drop_rate) || 1) : 0;
      rows.push(s);
    }
  }
  // Droppers first, so the page that opens shows them.
  rows.sort((a, b) => b.ratio - a.ratio);
  return rows;
}

function renderSockets(snapshot) {
  const rows = socketRows(snapshot);
  setText(document.getElementById("socket-count"), rows.length);
  const from = pager("sockets", rows.length, renderAll);
  syncRows(document.querySelector("#sockets tbody"), rows.slice(from, from + PAGE), (s) => `${s.process}\u0000${s.id}`,
    (s) => {
      const tr = el("tr", { tabindex: "0", "data-kind": s.kind, "data-name": s.name },
        el("td", {}, el("span", { class: "tag" }, s.process)), el("td", {}, s.kind), el("td", { class: "name" }, s.name || "—"),
        el("td", { class: "client" }, el("span", { class: "clip", title: s.client }, s.client)),
        el("td", { class: "principal" }, el("span", { class: "clip", title: s.principal || "" }, s.principal || "")),
        el("td", {}, new Date(s.connected_at * 1000).toLocaleTimeString()),
        el("td", { class: "state" }), el("td", { class: "moved" }), el("td", { class: "num wrap" }), el("td", { class: "num" }),
        el("td", { class: "actions" }, el("span", { class: "buttons" })));
      if (CAN_CHANGE) {
        tr.querySelector(".buttons").append(el("button", {
          type: "button", class: "danger", onclick: () => disconnect(tr.item.process, tr.item.id),
        }, "disconnect"));
      }
      return tr;
    },
    (tr, s) => {
      const c = tr.cells;
      let stateText = "", moved = "", dropped = "", perSecond = "", hot = false;
      if (s.kind === "worker") {
        stateText = `prefetch ${s.prefetch}, leases ${s.leases}`;
        moved = `${num(s.acked)} acked, ${num(s.nacked)} nacked, ${num(s.redelivered || 0)} redelivered`;
      } else if (s.kind === "subscriber" || s.kind === "sse") {
        stateText = `${s.policy}, prio ${s.priority}, buffer ${num(s.buffered)}/${num(s.capacity)}, credit ${num(s.credit)}`;
        moved = `${num(s.delivered)} delivered`;
        dropped = `${num(s.dropped)} (${rate(s.drop_rate)}/s)`;
        perSecond = rate(s.rate);
        const lifetime = s.delivered + s.dropped;
        hot = s.ratio > 0.01 || (lifetime > 0 && s.dropped / lifetime > 0.01);
      } else if (s.kind === "multiplex") {
        stateText = `${num(s.subscriptions)} subscriptions`;
        moved = `${num(s.delivered)} delivered`;
        dropped = `${num(s.dropped)} (${rate(s.drop_rate)}/s)`;
        perSecond = rate(s.rate);
        const lifetime = s.delivered + s.dropped;
        hot = s.ratio > 0.01 || (lifetime > 0 && s.dropped / lifetime > 0.01);
      }
      setText(c[6], stateText); setText(c[7], moved); setText(c[8], dropped); setText(c[9], perSecond);
      tr.classList.toggle("hot", hot);
    });
}

function disconnect(process, id) {
  if (!window.confirm(`Disconnect socket ${id} on ${process}?`)) return;
  socket.send(JSON.stringify({ op: "disconnect", process, socket: id }));
}

// A gateway nobody uses yet says what to do next instead of showing empty tables.
function renderEmptyHint(snapshot) {
  const used = (snapshot.queues || []).length > 0 || snapshot.processes.some(
    (p) => p.topics.length > 0 || p.sockets.some((s) => s.kind !== "dashboard"));
  document.getElementById("empty-hint").hidden = used;
}

// -- workers: what each connected worker runs now ----------------------------------

function renderWorkers(snapshot) {
  const rows = [];
  for (const process of snapshot.processes) {
    for (const s of process.sockets) {
      if (s.kind !== "worker") continue;
      s.process = process.name;  // the frame's own objects, as socketRows: no copies
      rows.push(s);
    }
  }
  // Busy workers first, then by queue.
  rows.sort((a, b) => b.leases - a.leases || String(a.queue).localeCompare(String(b.queue)));
  setText(document.getElementById("worker-count"), rows.length);
  const tasks = snapshot.running_tasks || {};
  const from = pager("workers", rows.length, renderAll);
  const shown = rows.slice(from, from + PAGE);
  document.getElementById("worker-empty").hidden = rows.length > 0;
  syncRows(document.querySelector("#worker-table tbody"), shown,
    (w) => `${w.process}\u0000${w.id}`,
    (w) => {
      return el("tr", { tabindex: "0", "data-queue": w.queue, "data-socket": w.id },
        el("td", {}, el("span", { class: "tag" }, w.process)), el("td", { class: "name" }, w.queue),
        el("td", { class: "client" }, el("span", { class: "clip", title: w.client }, w.client)),
        el("td", { class: "principal" }, el("span", { class: "clip", title: w.principal || "" }, w.principal || "")),
        el("td", { class: "num" }), el("td", { class: "running" }), el("td", { class: "num" }));
    },
    (tr, w) => {
      const c = tr.cells;
      setText(c[4], `${num(w.leases)} / ${num(w.prefetch)}`);
      setText(c[6], num(w.acked));
      const running = (w.running || []).map((id) => {
        const task = tasks[String(id)];
        return task ? `${task.task} (${task.id.slice(0, 8)}, message ${id})` : `message ${id}`;
      });
      const more = w.leases > running.length ? ` and ${num(w.leases - running.length)} more` : "";
      setText(c[5], running.length ? running.join(", ") + more : "idle");
      c[5].classList.toggle("muted", running.length === 0);
    });
}

// -- tasks ---------------------------------------------------------------------------

const TASK_PAGE = 50;

function taskNotice(text, kind = "ok") {
  const p = document.getElementById("task-notice");
  p.className = `notice ${kind}`;
  p.textContent = text;
}

function short(value, n = 120) {
  return clip(value === undefined ? "" : JSON.stringify(value), n);
}

function argumentsText(t) {
  const args = (t.args || []).map((a) => JSON.stringify(a));
  for (const [k, v] of Object.entries(t.kwargs || {})) args.push(`${k}=${JSON.stringify(v)}`);
  return args.join(", ");
}

function outcomeOf(t) {
  // The whole result or last error for the details, and a line for the cell.
  if (t.status === "SUCCESSFUL") return { line: short(t.return_value), full: JSON.stringify(t.return_value, null, 2) };
  const last = (t.errors || [])[t.errors.length - 1];
  if (!last) return { line: "", full: "" };
  const lines = String(last.traceback || "").trim().split("\n");
  // A traceback's last line names the exception already ("ValueError: boom").
  const end = lines[lines.length - 1] || "";
  const name = String(last.exception_class_path || "").split(".").pop();
  return {
    line: clip(name && end.startsWith(name) ? end : `${last.exception_class_path}: ${end}`, 160),
    full: (t.errors || []).map((e, i) => `attempt ${i + 1}: ${e.exception_class_path}\n${e.traceback}`).join("\n\n"),
  };
}

function tasksUrl() {
  const t = state.tasks;
  const params = new URLSearchParams({ offset: String(state.pages.tasks * TASK_PAGE), limit: String(TASK_PAGE) });
  if (t.status) params.set("status", t.status);
  if (t.name) params.set("name", t.name);
  return `/api/tasks?${params}`;
}

async function loadTasks() {
  const t = state.tasks;
  const seq = (t.seq += 1);
  const { ok, body } = await api("GET", tasksUrl());
  if (seq !== t.seq) return;  // a later filter or page was asked for meanwhile
  if (!ok) {
    taskNotice(`Could not list tasks: ${body.error}: ${body.detail}`, "bad");
    return;
  }
  t.page = body;
  renderTasks();
}

function renderTasks() {
  const t = state.tasks;
  const page = t.page;
  if (!page) return;
  for (const button of document.querySelectorAll("#task-states button")) {
    const status = button.dataset.status;
    button.setAttribute("aria-pressed", String(status === t.status));
    const n = status ? page.counts[status] || 0 : Object.values(page.counts).reduce((a, b) => a + b, 0);
    setText(button.querySelector(".n"), num(n));
  }
  setText(document.getElementById("task-count"), num(page.total));
  const box = document.querySelector('.pager[data-table="tasks"]');
  const pages = Math.max(1, Math.ceil(page.total / TASK_PAGE));
  if (!box.firstChild) {
    const prev = el("button", { type: "button", class: "prev", "aria-label": "previous page of tasks" }, "‹");
    const next = el("button", { type: "button", class: "next", "aria-label": "next page of tasks" }, "›");
    prev.addEventListener("click", () => { state.pages.tasks = Math.max(0, state.pages.tasks - 1); loadTasks(); });
    next.addEventListener("click", () => { state.pages.tasks += 1; loadTasks(); });
    box.append(prev, el("span", { class: "where" }), next);
  }
  setText(box.querySelector(".where"), `${state.pages.tasks + 1} / ${pages}`);
  box.querySelector(".prev").disabled = state.pages.tasks === 0;
  box.querySelector(".next").disabled = state.pages.tasks >= pages - 1;
  box.hidden = pages === 1;
  const empty = document.getElementById("task-empty");
  empty.hidden = page.tasks.length > 0;
  setText(empty, t.status || t.name ? "No task matches."
    : "No task result yet: tasks enqueued through gateway.tasks.LeasecastBackend appear here.");
  syncRows(document.querySelector("#task-table tbody"), page.tasks, (x) => x.id,
    (x) => {
      const details = el("details", {}, el("summary", {}), el("pre", {}));
      const tr = el("tr", { tabindex: "0", "data-id": x.id },
        el("td", {}, el("span", { class: "status" })),
        el("td", { class: "task" }, el("span", {}), el("span", { class: "module muted" })),
        el("td", { class: "name" }),
        el("td", { class: "body" }, el("code", {})),
        el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "num" }),
        el("td", { class: "client" }, el("span", { class: "clip" })),
        el("td", { class: "outcome" }, details),
        el("td", { class: "actions" }, el("span", { class: "buttons" })));
      return tr;
    },
    (tr, x) => {
      const c = tr.cells;
      tr.dataset.status = x.status;
      const badge = c[0].firstChild;
      badge.className = `status ${x.status.toLowerCase()}`;
      setText(badge, x.status);
      // The function's name first, its module under it: both wrap at dots.
      const dot = x.task.lastIndexOf(".");
      setText(c[1].firstChild, x.task.slice(dot + 1));
      setText(c[1].lastChild, dot > 0 ? x.task.slice(0, dot) : "");
      c[1].title = x.task;
      setText(c[2], x.queue);
      const args = argumentsText(x);
      setText(c[3].firstChild, clip(args, 120));
      c[3].firstChild.title = args.slice(0, 4000);
      setText(c[4], num(x.attempts));
      setText(c[5], `${ago(Math.max(0, Date.now() / 1000 - x.enqueued_at))} ago`);
      setText(c[6], x.runtime === null ? "—" : ago(x.runtime));
      const holder = x.held_by ? `${x.held_by.client} (socket ${x.held_by.socket} on ${x.held_by.process})` : "";
      const worker = holder || x.worker || "—";
      setText(c[7].firstChild, worker);
      c[7].firstChild.title = worker;
      const outcome = outcomeOf(x);
      const details = c[8].firstChild;
      setText(details.firstChild, outcome.line || "—");
      setText(details.lastChild, outcome.full);
      details.classList.toggle("empty", !outcome.full);
      const buttons = c[9].firstChild;
      const want = !CAN_CHANGE ? "" : x.status === "FAILED" ? "retry" : x.status === "READY" || x.status === "RUNNING" ? "cancel" : "";
      if (buttons.dataset.want !== want) {
        buttons.dataset.want = want;
        buttons.replaceChildren();
        if (want === "retry") {
          buttons.append(el("button", { type: "button", class: "retry", onclick: () => retryTask(tr.item) }, "retry"));
        } else if (want === "cancel") {
          const cancel = el("button", { type: "button", class: "danger cancel", onclick: () => cancelTask(tr.item) },
            CANCEL_AVAILABLE ? "cancel" : "cancel (unavailable)");
          if (!CANCEL_AVAILABLE) {
            cancel.disabled = true;
            cancel.title = "This gateway has no cancel endpoint (POST /api/queues/Q/messages/ID/cancel) yet.";
          }
          buttons.append(cancel);
        }
      }
    });
}

async function retryTask(task) {
  if (!window.confirm(`Retry task ${task.task} (${task.id})? It runs again under the same id, on queue "${task.queue}".`)) return;
  const { ok, body } = await api("POST", `/api/tasks/${encodeURIComponent(task.id)}/retry`);
  if (ok) taskNotice(`Retried task ${task.id}: ${body.how === "requeued" ? "its dead message is" : "a new message is"} on ${body.queue} (message ${body.message_id}).`, "ok");
  else taskNotice(`Retry of task ${task.id} failed: ${body.error}: ${body.detail}`, "bad");
  return loadTasks();
}

async function cancelTask(task) {
  if (!CANCEL_AVAILABLE) return;
  if (!window.confirm(`Cancel task ${task.task} (${task.id})? Its message is dead-lettered; a worker running it is told to stop.`)) return;
  const path = `${queuePath(task.queue)}/messages/${encodeURIComponent(task.message_id)}/cancel`;
  const { status, ok, body } = await api("POST", path);
  if (status === 404) taskNotice(`Task ${task.id} has no message any more (it finished meanwhile). Nothing was changed.`, "warn");
  else if (!ok) taskNotice(`Cancel of task ${task.id} failed: ${body.error}: ${body.detail}`, "bad");
  else if (body.cancelled === 0) taskNotice(`Task ${task.id}'s message was already dead. Nothing was changed.`, "warn");
  else taskNotice(`Cancelled task ${task.id}.`, "ok");
  return loadTasks();
}

function setupTasks() {
  for (const button of document.querySelectorAll("#task-states button")) {
    button.addEventListener("click", () => {
      state.tasks.status = button.dataset.status;
      state.pages.tasks = 0;
      taskNotice("");
      loadTasks();
    });
  }
  let typing = null;
  document.getElementById("task-filter").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      state.tasks.name = event.target.value.trim();
      state.pages.tasks = 0;
      loadTasks();
    }, 250);
  });
  document.getElementById("task-refresh").addEventListener("click", () => loadTasks());
  loadTasks();
  // A page in a background tab asks nothing.
  setInterval(() => { if (document.visibilityState === "visible") loadTasks(); }, 10000);
}

// -- schedules: shown when the gateway answers GET /api/schedules ---------------------

function when(iso) {
  if (!iso) return "—";
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return String(iso);
  const seconds = (t - Date.now()) / 1000;
  return seconds >= 0 ? `in ${ago(seconds)}` : `${ago(-seconds)} ago`;
}

async function loadSchedules() {
  const { ok, body } = await api("GET", "/api/schedules");
  const section = document.getElementById("schedules");
  if (!ok || !Array.isArray(body.schedules)) {
    section.hidden = true;  // no schedules on this gateway (or not for this user)
    return;
  }
  section.hidden = false;
  const list = body.schedules;
  setText(document.getElementById("schedule-count"), list.length);
  document.getElementById("schedule-empty").hidden = list.length > 0;
  syncRows(document.querySelector("#schedule-table tbody"), list, (x) => x.name,
    (x) => el("tr", { tabindex: "0", "data-schedule": x.name },
      el("td", { class: "name" }, x.name), el("td", { class: "name" }), el("td", {}),
      el("td", { class: "num" }), el("td", { class: "num" }), el("td", { class: "num" }), el("td", {})),
    (tr, x) => {
      const c = tr.cells;
      const task = x.body && typeof x.body === "object" && typeof x.body.task === "string" ? x.body.task : null;
      setText(c[1], task ? `${x.queue} · ${task}` : x.queue);
      const rule = x.cron ? `cron ${x.cron}` : `every ${num(x.every)} s`;
      setText(c[2], x.timezone && x.timezone !== "UTC" ? `${rule} (${x.timezone})` : rule);
      setText(c[3], x.enabled ? when(x.next_tick) : "—");
      c[3].title = x.next_tick || "";
      setText(c[4], when(x.last_tick));
      c[4].title = x.last_tick || "";
      setText(c[5], num(x.fired));
      setText(c[6], x.enabled ? "enabled" : "disabled");
      tr.classList.toggle("off", !x.enabled);
    });
}

// -- forms: create a queue, publish a message ------------------------------------------

const NAME = /^[A-Za-z0-9._-]{1,200}$/;

function formNotice(form, text, kind) {
  const p = form.querySelector(".notice");
  p.className = `notice ${kind}`;
  p.textContent = text;
}

function parseJson(text, what) {
  // A clear message for what people type: a bare word is not JSON.
  try {
    return { value: JSON.parse(text) };
  } catch (e) {
    return { error: `${what} is not JSON (${e.message}). A string needs its quotes: "hello".` };
  }
}

function setupForms() {
  const create = document.getElementById("create-queue");
  create?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const name = create.elements.name.value.trim();
    const raw = create.elements.settings.value.trim();
    if (!NAME.test(name)) {
      formNotice(create, `"${clip(name, 60)}" is no queue name: 1-200 characters of letters, digits, ".", "_" and "-".`, "bad");
      return;
    }
    let settings = {};
    if (raw) {
      const parsed = parseJson(raw, "The settings");
      if (parsed.error) return formNotice(create, parsed.error, "bad");
      if (!parsed.value || typeof parsed.value !== "object" || Array.isArray(parsed.value)) {
        return formNotice(create, "The settings must be a JSON object, e.g. {\"max_deliveries\": 5}.", "bad");
      }
      settings = parsed.value;
    }
    const before = await api("GET", queuePath(name));
    const { ok, body } = await api("PATCH", queuePath(name), settings);
    if (!ok) return formNotice(create, `Not created: ${body.error}: ${body.detail}`, "bad");
    formNotice(create, before.status === 404 ? `Created queue ${name}.` : `Queue ${name} already existed; its settings are applied.`, "ok");
    create.elements.name.value = "";
  });
  const publish = document.getElementById("publish");
  publish?.addEventListener("submit", async (event) => {
    event.preventDefault();
    const topic = publish.elements.topic.value.trim();
    const raw = publish.elements.body.value.trim();
    if (!NAME.test(topic)) {
      formNotice(publish, `"${clip(topic, 60)}" is no topic name: 1-200 characters of letters, digits, ".", "_" and "-".`, "bad");
      return;
    }
    if (!raw) return formNotice(publish, "Write a body: any JSON value.", "bad");
    const parsed = parseJson(raw, "The body");
    if (parsed.error) return formNotice(publish, parsed.error, "bad");
    const { ok, body } = await api("POST", `/api/topics/${encodeURIComponent(topic)}/messages`, { messages: [{ body: parsed.value }] });
    if (!ok) return formNotice(publish, `Not published: ${body.error}: ${body.detail}`, "bad");
    formNotice(publish, `Published 1 message to ${topic}.`, "ok");
  });
}

// -- the loop --------------------------------------------------------------------

function renderAll() {
  const snapshot = state.snapshot;
  if (!snapshot) return;
  const started = performance.now();
  const names = snapshot.processes.map((p) => p.name);
  setText(document.getElementById("processes"),
    `${names.length} gateway process${names.length === 1 ? "" : "es"}: ${names.join(", ")}`);
  renderEmptyHint(snapshot);
  renderCharts();
  renderAlerts(snapshot);
  renderHeatmap();
  renderQueues(snapshot);
  renderWorkers(snapshot);
  renderTopics(snapshot);
  renderSockets(snapshot);
  const times = window.leasecastRenderTimes;
  times.push(performance.now() - started);
  if (times.length > 600) times.shift();
}

function onFrame(frame) {
  if (frame.op === "history") {
    // It follows the first snapshot: keep what that snapshot brought after it.
    const newer = state.samples;
    state.bucket = frame.bucket;
    state.keep = frame.keep;
    state.samples = [];
    addSamples(frame.samples);
    addSamples(newer);
    renderCharts();
  } else if (frame.op === "snapshot") {
    addSamples(frame.samples || []);
    state.labels = frame.labels || {};
    state.snapshot = frame;
    renderAll();
  } else if (frame.op === "error") {
    window.alert(`${frame.code}: ${frame.detail}`);
  }
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/ws/dashboard/`);
  const status = document.getElementById("status");
  socket.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  socket.onmessage = (event) => {
    const started = performance.now();
    onFrame(JSON.parse(event.data));
    // Parse and render together: what a frame costs the page's main thread.
    const times = window.leasecastFrameTimes;
    times.push(performance.now() - started);
    window.leasecastFrameBytes = event.data.length;
    if (times.length > 600) times.shift();
  };
  socket.onclose = () => {
    status.textContent = "reconnecting…";
    status.className = "status";
    setTimeout(connect, 1000);
  };
}

for (const id of ["focus-queue", "focus-topic", "socket-kind"]) {
  document.getElementById(id).addEventListener("change", () => { state.pages.sockets = 0; renderAll(); });
}
for (const id of ["queue-filter", "socket-filter"]) {
  document.getElementById(id).addEventListener("input", () => { state.pages.queues = 0; state.pages.sockets = 0; renderAll(); });
}
setupBrowser();
setupTasks();
setupForms();
loadSchedules();
setInterval(() => { if (document.visibilityState === "visible") loadSchedules(); }, 10000);
connect();
