// Leasecast dashboard: renders the snapshot /ws/dashboard/ pushes every second.
// Plain JavaScript, no build step. Every value from the server is inserted as
// text (textContent), never as HTML: queue names, topics and clients are data.
"use strict";

const HISTORY = 60; // points in each sparkline (one a second)
const series = { enqueued: [], acked: [], fanout: [], drops: [] };
const queueSeries = {}; // queue -> {enqueued: [], acked: [], redelivered: []}
let previous = null; // the last snapshot, for rates
let socket = null;

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

function num(value, digits = 0) {
  return Number(value || 0).toLocaleString(undefined, { maximumFractionDigits: digits });
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 60) return `${seconds.toFixed(1)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min`;
  return `${(seconds / 3600).toFixed(1)} h`;
}

function push(list, value) {
  list.push(value);
  if (list.length > HISTORY) list.shift();
}

function spark(svg, values) {
  const width = svg.clientWidth || 200;
  const height = svg.clientHeight || 30;
  const max = Math.max(1, ...values);
  const step = width / Math.max(1, HISTORY - 1);
  const offset = (HISTORY - values.length) * step;
  const points = values.map((v, i) => `${(offset + i * step).toFixed(1)},${(height - 2 - (v / max) * (height - 4)).toFixed(1)}`);
  svg.replaceChildren();
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
}

function miniSpark(values) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.style.width = "90px";
  svg.style.height = "20px";
  requestAnimationFrame(() => spark(svg, values));
  return svg;
}

function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

async function queueAction(queue, action) {
  const verb = action === "purge" ? "Purge every message not in flight from" : "Redrive every dead message of";
  if (!window.confirm(`${verb} "${queue}"?`)) return;
  const response = await fetch(`/api/queues/${encodeURIComponent(queue)}/${action}`, {
    method: "POST",
    headers: { "X-CSRFToken": csrfToken() },
    credentials: "same-origin",
  });
  const body = await response.json();
  if (!response.ok) window.alert(`${action} failed: ${body.error}: ${body.detail}`);
}

function disconnect(process, id) {
  if (!window.confirm(`Disconnect socket ${id} on ${process}?`)) return;
  socket.send(JSON.stringify({ op: "disconnect", process, socket: id }));
}

function totals(snapshot) {
  // Counters summed over processes, per queue and overall.
  const perQueue = {};
  const overall = { enqueued: 0, acked: 0, fanout: 0, drops: 0 };
  for (const process of snapshot.processes) {
    for (const [queue, counters] of Object.entries(process.counters || {})) {
      const mine = (perQueue[queue] ||= { enqueued: 0, acked: 0, redelivered: 0 });
      mine.enqueued += counters.enqueued;
      mine.acked += counters.acked;
      mine.redelivered += counters.redelivered;
      overall.enqueued += counters.enqueued;
      overall.acked += counters.acked;
    }
    for (const s of process.sockets) {
      if (s.kind === "subscriber") {
        overall.fanout += s.delivered;
        overall.drops += s.dropped;
      }
    }
  }
  return { perQueue, overall, time: Date.now() / 1000 };
}

function render(snapshot) {
  const now = totals(snapshot);
  const dt = previous ? Math.max(0.2, now.time - previous.time) : 1;
  const rate = (key, q) => {
    if (!previous) return 0;
    const a = q ? (now.perQueue[q] || {})[key] || 0 : now.overall[key];
    const b = q ? (previous.perQueue[q] || {})[key] || 0 : previous.overall[key];
    return Math.max(0, (a - b) / dt);
  };
  for (const key of Object.keys(series)) {
    const value = rate(key);
    push(series[key], value);
    spark(document.getElementById(`chart-${key}`), series[key]);
    document.getElementById(`now-${key}`).textContent = num(value);
  }

  const names = snapshot.processes.map((p) => p.name);
  document.getElementById("processes").textContent =
    `${names.length} gateway process${names.length === 1 ? "" : "es"}: ${names.join(", ")}`;

  // Queues
  const queueRows = (Array.isArray(snapshot.queues) ? snapshot.queues : []).map((q) => {
    const s = (queueSeries[q.name] ||= { enqueued: [], acked: [], redelivered: [] });
    const rates = {};
    for (const key of Object.keys(s)) {
      rates[key] = rate(key, q.name);
      push(s[key], rates[key]);
    }
    return el("tr", { "data-queue": q.name },
      el("td", {}, q.name),
      el("td", { class: "num visible" }, num(q.visible)),
      el("td", { class: "num" }, num(q.delayed)),
      el("td", { class: "num" }, num(q.in_flight)),
      el("td", { class: "num dead" }, num(q.dead)),
      el("td", {}, miniSpark(s.enqueued), " ", num(rates.enqueued)),
      el("td", {}, miniSpark(s.acked), " ", num(rates.acked)),
      el("td", {}, miniSpark(s.redelivered), " ", num(rates.redelivered)),
      el("td", { class: "num" }, ago(q.oldest_visible_age)),
      el("td", {},
        el("button", { class: "danger purge", onclick: () => queueAction(q.name, "purge") }, "purge"), " ",
        el("button", { class: "redrive", onclick: () => queueAction(q.name, "redrive") }, "redrive")));
  });
  document.querySelector("#queues tbody").replaceChildren(...queueRows);

  // Topics
  const topicRows = [];
  for (const process of snapshot.processes) {
    for (const t of process.topics) {
      topicRows.push(el("tr", {},
        el("td", {}, t.name), el("td", {}, el("span", { class: "tag" }, process.name)),
        el("td", { class: "num" }, num(t.subscribers)), el("td", { class: "num" }, num(t.publish_rate, 1)),
        el("td", { class: "num" }, num(t.dropped))));
    }
  }
  document.querySelector("#topics tbody").replaceChildren(...topicRows);

  // Sockets
  const prevAcked = {};
  for (const process of (previous && previous.snapshot ? previous.snapshot.processes : [])) {
    for (const s of process.sockets) prevAcked[`${process.name}/${s.id}`] = s.acked || 0;
  }
  const socketRows = [];
  for (const process of snapshot.processes) {
    for (const s of process.sockets) {
      if (s.kind === "dashboard") continue;
      let state = "", moved = "", dropped = "", perSecond = "", hot = false;
      if (s.kind === "worker") {
        state = `prefetch ${s.prefetch}, leases ${s.leases}`;
        moved = `${num(s.acked)} acked, ${num(s.nacked)} nacked, ${num(s.redelivered || 0)} redelivered`;
        const before = prevAcked[`${process.name}/${s.id}`];
        perSecond = before === undefined ? "–" : num(Math.max(0, (s.acked - before) / dt));
      } else if (s.kind === "subscriber") {
        const fill = s.capacity ? s.buffered / s.capacity : 0;
        const bar = el("span", { class: `fill${fill >= 1 ? " full" : ""}` }, el("span", { style: `width:${Math.round(fill * 100)}%` }));
        state = el("span", {}, `${s.policy}, prio ${s.priority}, `, bar, ` ${num(s.buffered)}/${num(s.capacity)}, credit ${num(s.credit)}`);
        moved = `${num(s.delivered)} delivered`;
        const total = s.rate + s.drop_rate;
        dropped = `${num(s.dropped)} (${num(s.drop_rate, 1)}/s)`;
        perSecond = num(s.rate, 1);
        const lifetime = s.delivered + s.dropped;
        hot = (total > 0 && s.drop_rate / total > 0.01) || (lifetime > 0 && s.dropped / lifetime > 0.01);
      }
      const since = new Date(s.connected_at * 1000).toLocaleTimeString();
      socketRows.push(el("tr", { class: hot ? "hot" : "", "data-kind": s.kind, "data-name": s.queue || s.topic || "" },
        el("td", {}, el("span", { class: "tag" }, process.name)),
        el("td", {}, s.kind), el("td", {}, s.queue || s.topic || "–"), el("td", {}, s.client),
        el("td", { class: "principal" }, s.principal || ""), el("td", {}, since), el("td", {}, state), el("td", {}, moved), el("td", { class: "num" }, dropped),
        el("td", { class: "num" }, perSecond),
        el("td", {}, el("button", { class: "danger", onclick: () => disconnect(process.name, s.id) }, "disconnect"))));
    }
  }
  document.querySelector("#sockets tbody").replaceChildren(...socketRows);
  previous = { ...now, snapshot };
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/ws/dashboard/`);
  const status = document.getElementById("status");
  socket.onopen = () => { status.textContent = "live"; status.className = "status live"; };
  socket.onmessage = (event) => {
    const frame = JSON.parse(event.data);
    if (frame.op === "snapshot") render(frame);
    else if (frame.op === "error") window.alert(`${frame.code}: ${frame.detail}`);
  };
  socket.onclose = () => {
    status.textContent = "reconnecting…";
    status.className = "status";
    setTimeout(connect, 1000);
  };
}

connect();
