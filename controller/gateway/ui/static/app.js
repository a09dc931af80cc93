// The node's page: polls /ui/api/state every second and draws it. Vanilla JS, no build
// step: what ships in the package is what runs. Text from engines and journals is only
// ever set as textContent (never parsed as HTML).
"use strict";

const POLL_MS = 1000;
const LOG_POLL_MS = 2000;
const KEY_SLOT = "reconcile.apiKey";  // an API key, or (a gateway without keys) the token
const GiB = 1024 ** 3;

const $ = (id) => document.getElementById(id);
const state = { doc: null, drawn: {}, filter: "", log: null, logTimer: null, pollTimer: null };

// -- small helpers ---------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function svg(tag, attrs) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n >= 10 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
}

function age(iso, now) {
  if (!iso) return "-";
  let s = Math.max(0, (now - Date.parse(iso)) / 1000);
  if (s < 120) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

function clock(iso) {
  const d = new Date(iso);
  return isNaN(d) ? String(iso || "") : d.toLocaleTimeString([], { hour12: false });
}

function key() { return sessionStorage.getItem(KEY_SLOT); }

async function api(path, options) {
  const headers = Object.assign({}, (options && options.headers) || {});
  const k = key();
  if (k) headers.Authorization = `Bearer ${k}`;
  return fetch(path, Object.assign({ cache: "no-store" }, options || {}, { headers }));
}

function notice(text, bad) {
  const el = $("notice");
  el.textContent = text;
  el.className = bad ? "notice error" : "notice";
  el.hidden = !text;
  clearTimeout(notice.timer);
  if (text) notice.timer = setTimeout(() => { el.hidden = true; }, 6000);
}

// -- polling ---------------------------------------------------------------------------

async function poll() {
  clearTimeout(state.pollTimer);
  try {
    const q = state.filter ? `?events=${encodeURIComponent(state.filter)}` : "";
    const resp = await api(`/ui/api/state${q}`);
    if (resp.status === 401) return refused(resp);
    if (!resp.ok) throw new Error(`the gateway answered ${resp.status}`);
    const doc = await resp.json();
    signedIn(doc);
    draw(doc);
    $("live").textContent = "live";
    $("live").className = "live ok";
  } catch (err) {
    $("live").textContent = `no answer (${err.message}); retrying`;
    $("live").className = "live stale";
  } finally {
    state.pollTimer = setTimeout(poll, POLL_MS);
  }
}

async function refused(resp) {
  const doc = await resp.json().catch(() => ({}));
  const code = (doc.error && doc.error.code) || "";
  const token = code === "invalid_token";
  const why = key() ? `that ${token ? "token" : "key"} was not accepted` : "";
  return signIn(why, token);
}

// The token of `reconcile ui`'s URL (?token=): kept for this tab's calls, then taken out
// of the address bar and the history.
function keepToken() {
  const params = new URLSearchParams(window.location.search);
  const token = params.get("token");
  if (!token) return;
  sessionStorage.setItem(KEY_SLOT, token);
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", window.location.pathname + (rest ? `?${rest}` : ""));
}

function signIn(why, token) {
  $("signin-keys").hidden = !!token;
  $("signin-token").hidden = !token;
  state.doc = null;
  state.drawn = {};
  $("data").hidden = true;
  $("signin").hidden = false;
  $("signout").hidden = true;
  $("drain").hidden = $("uncordon").hidden = true;
  $("signin-error").hidden = !why;
  $("signin-error").textContent = why || "";
  $("live").textContent = "signed out";
  $("live").className = "live";
  for (const id of ["deployments", "events", "requests"]) $(id).tBodies[0].replaceChildren();
  for (const id of ["devices", "traffic", "log", "unreadable"]) $(id).replaceChildren();
  // What the node says of itself is data too: its name, its drain and its git source.
  for (const id of ["unreadable", "banner", "source", "notice"]) $(id).hidden = true;
  for (const id of ["node", "banner", "source"]) $(id).textContent = "";
  state.filter = "";  // the events filter lists the deployments' names
  $("filter").replaceChildren(h("option", { value: "" }, "all deployments"));
}

function signedIn(doc) {
  $("signin").hidden = true;
  $("data").hidden = false;
  $("signout").hidden = !doc.keys;
}

// -- drawing ---------------------------------------------------------------------------

function changed(part, value) {
  const text = JSON.stringify(value);
  if (state.drawn[part] === text) return false;
  state.drawn[part] = text;
  return true;
}

function draw(doc) {
  state.doc = doc;
  $("node").textContent = doc.node;
  $("version").textContent = `reconcile ${doc.version}`;
  drawDrain(doc.drain);
  drawSource(doc.source);
  if (changed("unreadable", doc.unreadable)) drawUnreadable(doc.unreadable || []);
  if (changed("deployments", [doc.deployments, doc.facts])) drawDeployments(doc);
  drawAges(doc);
  if (changed("devices", doc.devices)) drawDevices(doc.devices);
  if (changed("traffic", doc.traffic)) drawTraffic(doc.traffic);
  if (changed("events", [doc.events, doc.deployments.map((d) => d.name)])) drawEvents(doc);
  if (changed("requests", doc.requests)) drawRequests(doc.requests || []);
}

// The request log's last lines (reconcile logs --requests), newest first.
function drawRequests(lines) {
  const secs = (v) => (typeof v === "number" ? `${v.toFixed(3)} s` : "");
  // No usage counted (a 404, a 429, a stream cut before its usage): "-", as `reconcile logs
  // --requests` says it, not "0+0", which reads as an answer of no tokens.
  const tokens = (r) => (r.prompt_tokens == null && r.completion_tokens == null
    ? "-" : `${r.prompt_tokens || 0}+${r.completion_tokens || 0}`);
  const rows = lines.slice().reverse().map((r) => h("tr", {},
    h("td", { class: "time", title: r.time }, clock(r.time)),
    h("td", {}, String(r.status)),
    h("td", {}, r.model || ""),
    h("td", {}, r.instance || r.deployment || ""),
    h("td", {}, r.key || ""),
    h("td", {}, secs(r.ttfb_s)),
    h("td", {}, secs(r.duration_s)),
    h("td", {}, tokens(r))));
  $("requests").tBodies[0].replaceChildren(...rows);
  $("no-requests").hidden = rows.length > 0;
}

function drawDrain(drain) {
  const banner = $("banner");
  banner.hidden = !drain;
  if (drain) {
    const by = drain.by ? ` by ${drain.by}` : "";
    const why = drain.reason ? ` (${drain.reason})` : "";
    const until = drain.until ? ` until ${clock(drain.until)}` : "";
    banner.textContent = `This node is drained${by}${why}${until}: nothing new starts or restarts.`;
  }
  $("drain").hidden = !!drain;
  $("uncordon").hidden = !drain;
}

// The git source's line, as `reconcile status` prints it above its table.
const SOURCE_LOOKS = { Synced: "ok", Progressing: "busy", Pinned: "busy" };

function drawSource(source) {
  const line = $("source");
  line.hidden = !source;
  if (!source) return;
  const ref = source.tag ? `tag ${source.tag}` : source.branch;
  const at = source.applied ? source.applied.slice(0, 12) : "-";
  line.textContent = `source: ${source.url} ${ref} path ${source.path}: ${source.state} at ${at} (${source.message})`;
  line.className = `source ${SOURCE_LOOKS[source.state] || "bad"}`;
}

// Records the node cannot read (torn, or of a newer version), each named as `reconcile
// status` names it: its file, what is wrong, and the next move.
function drawUnreadable(problems) {
  const box = $("unreadable");
  box.hidden = problems.length === 0;
  box.replaceChildren(...problems.map((p) =>
    h("p", { "data-name": p.name || "", title: p.file }, p.message)));
}

function model(item, facts) {
  const f = facts[item.name] || (item.instances[0] && facts[item.instances[0].name]);
  const models = f ? f.models.filter((m) => m !== item.name) : [];
  return models.length ? models.join(", ") : item.name;
}

function isOnDemand(item, facts) {
  return item.instances.some((i) => facts[i.name] && facts[i.name].on_demand);
}

function drawDeployments(doc) {
  const body = $("deployments").tBodies[0];
  const rows = doc.deployments.map((item) => deploymentRow(item, doc.facts));
  body.replaceChildren(...rows);
  $("no-deployments").hidden = rows.length > 0;
}

function deploymentRow(item, facts) {
  const where = [...new Set(item.instances.map((i) => `${i.node} / ${i.host}`))].join(", ");
  const ports = [...new Set(item.instances.map((i) => i.port).filter((p) => p))].join(", ");
  const lastExit = item.last_exit ? ` · last exit: ${item.last_exit.text}` : "";
  // what holds it (an emptied manifest folder) leads the message, as in `status`
  const said = [...(item.conditions || []), item.message].filter(Boolean).join("; ");
  const message = h("td", { class: "message" }, said);
  if (item.pull) message.append(pullBar(item.pull));
  const buttons = h("td", { class: "buttons" });
  if (isOnDemand(item, facts)) {
    buttons.append(actionButton("load", item.name, "Load"), actionButton("unload", item.name, "Unload"));
  }
  buttons.append(actionButton("restart", item.name, "Restart"));
  const row = h("tr", { "data-name": item.name, class: "clickable", title: "show its log" },
    h("td", { class: "name" }, item.name),
    // The deployment's worst replica and every instance's restarts, as `status` shows them.
    h("td", { class: "phase" }, h("span", { class: `badge ${item.worst_phase.toLowerCase()}` }, item.worst_phase)),
    h("td", { class: "ready" }, `${item.ready_replicas}/${item.replicas}`),
    h("td", { class: "model" }, model(item, facts)),
    h("td", { class: "backend" }, item.backend || item.engine),
    h("td", { class: "where" }, where || "-"),
    h("td", { class: "port" }, ports || "-"),
    h("td", { class: "restarts", title: lastExit.slice(3) || null }, String(item.restarts_total)),
    h("td", { class: "age", "data-since": item.reserved_at || item.started_at || "" }, ""),
    message,
    buttons);
  row.addEventListener("click", (ev) => {
    if (ev.target.closest("button")) return;
    openLog(item);
  });
  return row;
}

function drawAges(doc) {
  const now = Date.parse(doc.now);
  for (const cell of document.querySelectorAll("#deployments td.age")) {
    cell.textContent = age(cell.getAttribute("data-since"), now);
  }
}

function pullBar(pull) {
  const total = pull.bytes_total || 0;
  const pct = total ? Math.min(100, (100 * pull.bytes_done) / total) : 0;
  const bar = h("div", { class: "bar pull", role: "progressbar", "data-done": pull.bytes_done,
    "data-total": total, title: `${bytes(pull.bytes_done)} of ${total ? bytes(total) : "?"}` });
  const fill = h("div", { class: "fill" });
  fill.style.width = `${pct}%`;
  bar.append(fill);
  bar.setAttribute("aria-valuenow", pct.toFixed(0));
  return bar;
}

function actionButton(action, name, label) {
  const b = h("button", { type: "button", class: "small", "data-action": action, "data-name": name }, label);
  b.addEventListener("click", () => act(action, { name }));
  return b;
}

async function act(action, body) {
  try {
    const resp = await api(`/ui/api/${action}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    if (resp.status === 401) return refused(resp);
    const doc = await resp.json().catch(() => ({}));
    if (!resp.ok) return notice((doc.error && doc.error.message) || `${action}: ${resp.status}`, true);
    notice(doc.message || `${action} asked`);
    poll();
  } catch (err) {
    notice(`${action}: ${err.message}`, true);
  }
}

// -- devices ---------------------------------------------------------------------------

function drawDevices(devices) {
  const out = devices.map(deviceBar);
  $("devices").replaceChildren(...out);
  $("no-devices").hidden = out.length > 0;
}

function deviceBar(d) {
  const total = d.memory;
  const requested = d.memory_allocated || 0;
  const whole = d.holders.some((x) => x.memory === null);
  const measured = d.memory_total_mb !== null && d.memory_free_mb !== null
    ? (d.memory_total_mb - d.memory_free_mb) * 1024 * 1024 : null;
  const free = total === null ? null : whole ? 0 : Math.max(0, total - Math.max(requested, measured || 0));
  const bar = h("div", { class: "bar memory", "data-total": total, "data-requested": requested,
    "data-measured": measured, "data-free": free });
  if (total) {
    for (const holder of d.holders) {
      const part = holder.memory === null ? total : holder.memory;
      const seg = h("div", { class: `fill holder ${holder.phase.toLowerCase()}`,
        title: `${holder.name}: ${holder.memory === null ? "the whole device" : bytes(holder.memory)}` },
        holder.name);
      seg.style.width = `${Math.min(100, (100 * part) / total)}%`;
      bar.append(seg);
    }
    if (measured !== null) {
      const mark = h("div", { class: "measured", title: `measured in use: ${bytes(measured)}` });
      mark.style.left = `${Math.min(100, (100 * measured) / total)}%`;
      bar.append(mark);
    }
  }
  const figures = total === null
    ? `memory unknown · held by ${d.held_by.join(", ") || "nobody"}`
    : `requested ${bytes(requested)}${whole ? " (a whole-device lease)" : ""} · measured ` +
      `${measured === null ? "-" : bytes(measured)} · free ${bytes(free)} of ${bytes(total)}`;
  return h("div", { class: "device", "data-device": d.device, "data-health": d.health || "" },
    h("div", { class: "device-head" },
      h("strong", {}, d.device), " ", d.name || "", " ",
      h("span", { class: "holders" }, d.held_by.length ? `held by ${d.held_by.join(", ")}` : "free"),
      d.health === "Unhealthy"
        ? h("span", { class: "badge failed", title: d.health_reason || "" }, "Unhealthy") : null),
    bar,
    h("div", { class: "figures" }, figures));
}

// -- traffic ---------------------------------------------------------------------------

function spark(values, label, format) {
  const w = 120, hgt = 28;
  const nums = values.map((v) => (v === null ? null : Number(v)));
  const max = Math.max(1e-9, ...nums.filter((v) => v !== null));
  const box = svg("svg", { viewBox: `0 0 ${w} ${hgt}`, preserveAspectRatio: "none", class: "spark",
    role: "img", "aria-label": label });
  const points = [];
  nums.forEach((v, i) => {
    if (v === null) return;
    const x = nums.length > 1 ? (i * w) / (nums.length - 1) : w;
    points.push(`${x.toFixed(1)},${(hgt - 2 - ((hgt - 4) * v) / max).toFixed(1)}`);
  });
  box.append(svg("polyline", { points: points.join(" "), fill: "none" }));
  if (points.length) {  // the newest sample as a dot: one sample draws no line
    const [x, y] = points[points.length - 1].split(",");
    box.append(svg("circle", { cx: Math.min(Number(x), w - 2), cy: y, r: 2 }));
  }
  const last = [...nums].reverse().find((v) => v !== null);
  return h("div", { class: "metric", "data-metric": label },
    h("span", { class: "metric-label" }, label),
    h("span", { class: "metric-value" }, last === undefined ? "-" : format(last)), box);
}

function drawTraffic(traffic) {
  const names = Object.keys(traffic);
  const rate = (v) => `${v.toFixed(v < 10 ? 2 : 0)}/s`;
  const ms = (v) => `${(v * 1000).toFixed(v < 0.1 ? 1 : 0)} ms`;
  const out = names.map((name) => {
    const s = traffic[name];
    return h("div", { class: "traffic", "data-deployment": name },
      h("strong", {}, name),
      spark(s.rps, "requests", rate), spark(s.errors, "errors", rate),
      spark(s.p50, "p50", ms), spark(s.p99, "p99", ms));
  });
  $("traffic").replaceChildren(...out);
  $("no-traffic").hidden = out.length > 0;
}

// -- events ----------------------------------------------------------------------------

function drawEvents(doc) {
  const select = $("filter");
  const names = doc.deployments.map((d) => d.name);
  const have = [...select.options].map((o) => o.value).slice(1);
  if (JSON.stringify(have) !== JSON.stringify(names)) {
    select.replaceChildren(h("option", { value: "" }, "all deployments"),
      ...names.map((n) => h("option", { value: n }, n)));
    select.value = names.includes(state.filter) ? state.filter : "";
  }
  const rows = doc.events.map((e) => h("tr", { "data-deployment": e.deployment },
    h("td", { class: "time", title: e.time }, clock(e.time)),
    h("td", {}, e.deployment),
    h("td", { class: "action" }, e.action || ""),
    h("td", { class: "reason" }, e.reason || ""),
    h("td", {}, e.outcome || "")));
  $("events").tBodies[0].replaceChildren(...rows);
}

// -- the log ---------------------------------------------------------------------------

function openLog(item) {
  state.log = item.instances.length ? item.instances[0].name : item.name;
  $("logpanel").hidden = false;
  $("logname").textContent = item.name;
  const picks = item.instances.length > 1
    ? item.instances.map((i) => {
      const b = h("button", { type: "button", class: "small" }, i.name);
      b.addEventListener("click", () => { state.log = i.name; loadLog(); });
      return b;
    })
    : [];
  $("loginstances").replaceChildren(...picks);
  state.filter = item.name;
  $("filter").value = item.name;
  state.drawn.events = null;
  loadLog();
  poll();
}

async function loadLog() {
  clearTimeout(state.logTimer);
  if (!state.log) return;
  try {
    const resp = await api(`/ui/api/logs/${encodeURIComponent(state.log)}`);
    if (resp.ok) {
      const doc = await resp.json();
      const pre = $("log");
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = doc.lines.length ? doc.lines.join("\n") : "(no log yet)";
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    }
  } catch (err) {
    $("log").textContent = `log not read: ${err.message}`;
  }
  state.logTimer = setTimeout(loadLog, LOG_POLL_MS);
}

function closeLog() {
  state.log = null;
  clearTimeout(state.logTimer);
  $("logpanel").hidden = true;
}

// -- wiring ----------------------------------------------------------------------------

function start() {
  keepToken();
  $("signin").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY_SLOT, $("key").value.trim());
    $("key").value = "";
    poll();
  });
  $("signout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_SLOT);
    closeLog();
    signIn("");
  });
  $("filter").addEventListener("change", (ev) => {
    state.filter = ev.target.value;
    state.drawn.events = null;
    poll();
  });
  $("logclose").addEventListener("click", closeLog);
  $("drain").addEventListener("click", () => {
    const reason = window.prompt("Drain this node: nothing new starts or restarts. Why?", "");
    if (reason !== null) act("drain", { reason });
  });
  $("uncordon").addEventListener("click", () => act("uncordon", {}));
  poll();
}

document.addEventListener("DOMContentLoaded", start);
