// The console's pages: each polls the JSON API at the console's interval and redraws.
// No framework and no build step; every value goes into the page as text, never as HTML.
"use strict";

const body = document.body;
const page = body.dataset.page;
const writable = body.dataset.mode === "write";
const params = new URLSearchParams(location.search);
let app = params.get("app") || body.dataset.app || "";
let intervalMs = 2000;
let lastLetterCount = null;
let unknownApp = null;  // why ?app= names no app of this broker (a typo), once the console said so
let unknownShown = false;  // the dead-letter page shows that line: cleared once the app is there
let pollFailed = false;
let filters = {handler: params.get("handler") || "", error_type: params.get("error_type") || "",
               stream: params.get("stream") || ""};

// Bidirectional controls in a producer's text would reorder what the page shows (a key
// reading "evil" shown as "live"): they are shown as their code points instead.
const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
function visible(text) {
  return text.replace(BIDI, c => "<U+" + c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0") + ">");
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(visible(String(c))));
  }
  return node;
}

// A producer's text (a stream key, a header) may be megabytes: a page shows its start.
const CELL_MAX = 120, DETAIL_MAX = 4096;
function clip(text, max, length) {
  text = String(text);
  length = length === undefined ? text.length : length;  // the server may have cut it (cut)
  return length > max ? text.slice(0, max - 1) + `… (${length.toLocaleString("en")} characters)` : text;
}

function full(l, name) { return l.cut && l.cut[name] !== undefined ? l.cut[name] : String(l[name] || "-").length; }

function num(v) { return v === null || v === undefined ? "-" : Math.round(v).toLocaleString("en"); }
function age(s) {
  if (s === null || s === undefined) return "-";
  s = Math.max(s, 0);
  for (const [u, n] of [["d", 86400], ["h", 3600], ["m", 60]]) if (s >= n) return (s / n).toFixed(0) + u;
  return s.toFixed(1) + "s";
}
function ranges(qs) {
  if (!qs || !qs.length) return "-";
  const out = []; let start = qs[0], prev = qs[0];
  for (const q of qs.slice(1).concat([null])) {
    if (q === prev + 1) { prev = q; continue; }
    out.push(start === prev ? String(start) : start + "-" + prev);
    start = prev = q;
  }
  return out.join(",");
}

function table(headings, rows, numeric) {
  numeric = numeric || [];
  return el("table", {},
    el("thead", {}, el("tr", {}, headings.map((h, i) => el("th", {class: numeric.includes(i) ? "num" : null}, h)))),
    el("tbody", {}, rows.map(r => el("tr", {}, r.map((c, i) => el("td",
      // Long text may break anywhere (a key has no spaces): it never widens the page.
      {class: numeric.includes(i) ? "num" : typeof c === "string" && visible(c).length > 12 ? "long" : null}, c))))));
}

function show(id, text) {
  const node = document.getElementById(id);
  node.textContent = text || "";
  node.hidden = !text;
}

// What `conveyor status` warns of (a Redis that evicts or forgets on restart, entries past
// [queues] total), on every page: each can cost messages.
function showWarnings(lines) {
  const list = document.getElementById("warnings");
  const text = lines.join("\n");
  if (list.dataset.text === text) return;  // unchanged: leave the nodes (and a selection) be
  list.dataset.text = text;
  list.replaceChildren(...lines.map(line => el("li", {}, "warning: " + line)));
  list.hidden = !lines.length;
}

async function getJSON(url) {
  const response = await fetch(url, {headers: {"Accept": "application/json"}});
  const data = await response.json();
  if (!response.ok) throw Object.assign(new Error(data.error || response.statusText), {status: response.status});
  return data;
}

async function post(url, payload) {
  const response = await fetch(url, {
    method: "POST",
    headers: {"Content-Type": "application/json",
              "X-Conveyor-Token": sessionStorage.getItem("conveyor-token") || ""},
    body: JSON.stringify(Object.assign({app: app}, payload)),
  });
  const data = await response.json();
  pollFailed = false;  // what shows now is this action's answer: the next poll keeps it
  if (!response.ok) { show("error", data.error || response.statusText); show("notice", ""); return null; }
  show("error", "");
  return data;
}

function setContent(...nodes) {
  document.getElementById("content").replaceChildren(...nodes.filter(n => n !== null && n !== undefined));
}

// ---- charts: inline SVG, from what the console polled itself
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function chart(caption, series, unit) {
  const w = 360, h = 120, ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  const all = series.flatMap(s => s.points);
  const known = all.filter(p => p[1] !== null);
  const t0 = Math.min(...all.map(p => p[0])), t1 = Math.max(...all.map(p => p[0]));
  const top = Math.max(1, ...known.map(p => p[1]));
  const x = t => ((t - t0) / Math.max(t1 - t0, 1e-9) * (w - 4) + 2).toFixed(1);
  const y = v => (h - 2 - v / top * (h - 14)).toFixed(1);
  series.forEach((s, i) => {
    // A value of null (not known then) breaks the line: one polyline per known run.
    let run = [];
    for (const p of s.points.concat([[null, null]])) {
      if (p[1] !== null) { run.push(`${x(p[0])},${y(p[1])}`); continue; }
      if (run.length > 1) {
        const line = document.createElementNS(ns, "polyline");
        line.setAttribute("stroke", COLORS[i % COLORS.length]);
        line.setAttribute("points", run.join(" "));
        svg.append(line);
      } else if (run.length) {  // one known value between unknowns: a dot
        const [cx, cy] = run[0].split(",");
        const dot = document.createElementNS(ns, "circle");
        dot.setAttribute("cx", cx); dot.setAttribute("cy", cy); dot.setAttribute("r", "2.5");
        dot.setAttribute("fill", COLORS[i % COLORS.length]);
        svg.append(dot);
      }
      run = [];
    }
  });
  const label = document.createElementNS(ns, "text");
  label.setAttribute("x", 4); label.setAttribute("y", 11); label.setAttribute("font-size", "10");
  label.textContent = "max " + (unit === "ms" ? top.toFixed(top < 10 ? 1 : 0) + " ms" : num(top));
  svg.append(label);
  // Each series' name in its line's colour (set through the DOM: the policy allows no
  // inline style attribute).
  const legend = series.length < 2 ? [] : [" · ", ...series.flatMap((s, i) => {
    const name = el("span", {}, s.name);
    name.style.color = COLORS[i % COLORS.length];
    return i ? [", ", name] : [name];
  })];
  return el("figure", {}, svg, el("figcaption", {}, caption, ...legend));
}

function charts(pts) {
  if (pts.length < 2) return el("p", {class: "muted"}, "charts appear after a few polls");
  const queues = Object.keys(pts[pts.length - 1].lag);
  const latency = ["p50", "p95", "p99"].map(name =>
    ({name: name, points: pts.map(p => [p.at, p.latency_ms[name]])}));
  const timed = latency.some(s => s.points.some(p => p[1] !== null));
  return el("div", {class: "charts"},
    chart("messages/s", [{name: "handled", points: pts.map(p => [p.at, p.handled_per_s])},
                         {name: "in", points: pts.map(p => [p.at, p.in_per_s])}]),
    chart("dead-lettered/s", [{name: "dead", points: pts.map(p => [p.at, p.dead_per_s])}]),
    chart("lag per queue", queues.map(q => ({name: "q" + q, points: pts.map(p => [p.at, p.lag[q] || 0])}))),
    timed ? chart("handler latency (ms)", latency, "ms")
      : el("figure", {class: "empty"}, el("p", {class: "muted"},
          "handler latency: no daemon publishes it (it needs a meter: [http] port or a telemetry exporter)"),
        el("figcaption", {}, "handler latency (ms)")));
}

// ---- pages
function appsTable(data) {
  return table(["app", "daemons", "queues", "lag", "last read", "dead letters", "holds retention"],
    data.apps.map(a => [el("a", {href: "?app=" + encodeURIComponent(a.app)}, a.app), num(a.daemons),
      ranges(a.queues), num(a.lag), a.idle_s === null ? "-" : age(a.idle_s) + " ago",
      num(a.dead_letters), ranges(a.holds_retention)]), [1, 3, 5]);
}

async function overview(data) {
  const nodes = [el("h2", {}, "Apps on this broker"),
    data.apps.length ? appsTable(data) : el("p", {class: "muted"}, "no app on these queues yet")];
  const st = data.status[app];
  if (st) {
    const pts = (await getJSON("/api/charts?app=" + encodeURIComponent(app))).points;
    const arriving = pts.length ? pts[pts.length - 1].in_per_s_by_queue : {};
    const mine = st.groups.find(g => g.group === app);
    nodes.push(el("h2", {}, `App ${app}: lag `, el("span", {id: "total-lag"}, num(st.total_lag)),
                  ", ", el("span", {id: "dead-count"}, num(st.dead_letters)), " dead letter(s)"));
    const rate = r => r === undefined || r === null ? "-" : r.toFixed(1);
    nodes.push(table(["queue", "owner", "lag", "pending (cache)", "in/s", "acks/s"],
      st.queues.map(q => [q.queue, q.owner || "-", num(q.lag), num(q.cache_fill),
                          rate(arriving[q.queue]), rate(st.rates[q.queue])]), [0, 2, 3, 4, 5]));
    if (mine && mine.oldest_needed_ms !== null)
      nodes.push(el("p", {}, "oldest message still needed: " + age(data.at - mine.oldest_needed_ms / 1000) + " old"));
    const holders = st.groups.filter(g => g.holds_retention.length).map(g => g.group);
    nodes.push(el("p", {class: "muted"}, st.retention_follows_groups
      ? (holders.length ? "trimming waits for: " + holders.join(", ") : "no group holds retention back")
      : "retention goes by time or size here: no group holds it back"));
    nodes.push(el("h2", {}, "Last minutes"), charts(pts));
  } else if (app && !data.error) {
    // No group of that name: an app with dead letters only, or one the broker does not
    // know, which the console refuses with a 404 saying so (above the apps there are).
    if (unknownApp === null) {
      try { await getJSON("/api/charts?app=" + encodeURIComponent(app)); unknownApp = ""; }
      catch (e) { if (e.status !== 404) throw e; unknownApp = e.message; }
    }
    if (unknownApp) nodes.unshift(el("p", {class: "error", id: "unknown-app"}, unknownApp));
  }
  setContent(...nodes);
}

function hosted(stats) {
  return Object.keys(stats).filter(k => (k.startsWith("pool.") || k.startsWith("cell.")) && k.endsWith(".workers"))
    .sort().map(k => k.slice(k.indexOf(".") + 1, k.lastIndexOf(".")) + "=" + num(stats[k])).join(", ") || "-";
}

function ms(seconds) {
  if (seconds === undefined || seconds === null) return "-";
  const v = seconds * 1000;
  return v < 10 ? v.toFixed(1) : num(v);
}

function rateLimit(s) {
  if (s["rate.limit_per_s"] === undefined) return "-";
  const waiting = s["rate.waiting"] ? ` (${num(s["rate.waiting"])} waiting)` : "";
  return num(s["rate.limit_per_s"]) + "/s" + waiting;
}

function state(s, stale) {
  // "ready" and "draining" come with the heartbeat; a daemon older than them says neither.
  if (stale) return "stale";
  if (s.draining) return "draining";
  if (s["dead_letters.down_s"] !== undefined) return "dead-letter store down";
  if (s.ready === 0) return "not ready";
  return s.ready === 1 ? "ready" : "up";
}

function daemons(data) {
  const nodes = [];
  for (const [name, st] of Object.entries(data.status)) {
    nodes.push(el("h2", {}, `App ${name}: ${st.members.length} daemon(s)`));
    if (!st.members.length) { nodes.push(el("p", {class: "muted"}, "no daemon running")); continue; }
    nodes.push(table(["daemon", "version", "host", "pid", "queues", "slots", "pools / cells", "rate limit",
                      "handled", "dead", "latency p50 / p95 / p99 ms", "loop stalls", "cpu %",
                      "last heartbeat", "state"],
      st.members.map(m => {
        const s = m.stats, beat = s.at === undefined ? null : data.at - s.at;
        const stale = beat !== null && beat > Math.max(30, 10 * data.interval_s);
        const latency = s["latency.p50_s"] === undefined ? "-"
          : [s["latency.p50_s"], s["latency.p95_s"], s["latency.p99_s"]].map(ms).join(" / ");
        return [m.id, m.version || "-", m.host, m.pid || "-", ranges(m.queues),
          num(s["slots.in_use"]) + "/" + num(s["slots.available"]), hosted(s), rateLimit(s),
          num(s.handled), num(s.dead_lettered), latency, num(s["loop.stalls"]),
          s.cpu_percent === undefined ? "-" : s.cpu_percent.toFixed(0),
          beat === null ? "-" : age(beat) + " ago", el("span", {class: "state"}, state(s, stale))];
      }), [3, 8, 9, 10, 11, 12]));
  }
  setContent(...(nodes.length ? nodes : [el("p", {class: "muted"}, "no app on these queues yet")]));
}

function query() {
  const q = new URLSearchParams({app: app});
  for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
  return q;
}

// No handler (an undecodable entry) or no error type (a letter made from a text): "-",
// as `conveyor dlq show` prints them.
const BLANK_AS_DASH = new Set(["handler", "error_type"]);

async function detail(id) {
  const box = document.getElementById("detail");
  try {
    const d = await getJSON("/api/letters/" + encodeURIComponent(id) + "?app=" + encodeURIComponent(app));
    const fields = ["id", "namespace", "key", "handler", "error_type", "attempts", "failed_at",
                    "message_id", "trace_id", "content_type", "replay_of"];
    box.replaceChildren(...[el("h2", {}, "Letter " + d.id),
      table(["field", "value"], fields.map(f => [f, d[f] === null || (d[f] === "" && BLANK_AS_DASH.has(f)) ? "-" : clip(d[f], DETAIL_MAX)])),
      el("h3", {}, "error"), el("pre", {}, d.error),
      el("h3", {}, "headers"), el("pre", {}, clip(JSON.stringify(d.headers, null, 2), DETAIL_MAX)),
      el("h3", {}, d.body !== undefined ? "body" : "body (base64)"),
      el("pre", {id: "letter-body"}, d.body !== undefined ? d.body : d.body_base64),
      d.body_cut_at || d.body_base64_cut_at ? el("p", {class: "muted"}, "cut at 4096 characters") : null,
    ].filter(node => node !== null));
  } catch (e) { show("error", e.message); }
}

async function act(kind, payload, what) {
  if (kind === "purge" && !confirm(`Purge ${what}? Dead letters are deleted for good.`)) return;
  const result = await post("/api/letters/" + kind,
                            kind === "purge" ? Object.assign({confirm: true}, payload) : payload);
  if (result) {
    show("notice", kind === "purge" ? `purged ${result.purged} letter(s)`
      : `replayed ${result.replayed.length} letter(s)` + (result.skipped.length ? `; ${result.skipped.length} skipped` : ""));
    await letters(null, true);
  }
}

function writeButtons(payload, what) {
  if (!writable) return null;
  return el("span", {},
    el("button", {type: "button", class: "replay", onclick: () => act("replay", payload, what)}, "Replay"), " ",
    el("button", {type: "button", class: "danger purge", onclick: () => act("purge", payload, what)}, "Purge"));
}

async function letters(data, force) {
  if (!app) { setContent(el("p", {class: "muted"}, "pick an app")); return; }
  const count = data && data.status[app] ? data.status[app].dead_letters : lastLetterCount;
  if (!force && count === lastLetterCount && document.getElementById("letters")) return;
  lastLetterCount = count;
  let found;
  try {
    found = await getJSON("/api/letters?" + query());
  } catch (e) {
    // A poll's: tick shows it, and a poll that succeeds clears it; but an app the console
    // does not know (404) is shown as a refusal is, and not asked for again every poll.
    if (!force && e.status !== 404) throw e;
    found = e;  // refused when asked for (a filter too long): shown below
  }
  const form = el("form", {class: "filters", onsubmit: (e) => {
      e.preventDefault();
      for (const k of Object.keys(filters)) filters[k] = form.elements[k].value.trim();
      history.replaceState(null, "", "?" + query());
      letters(null, true);
    }},
    ...["handler", "error_type", "stream"].map(k => el("label", {}, k.replace("_", " ") + " ",
      el("input", {name: k, value: filters[k], placeholder: "any"}))),
    el("button", {type: "submit"}, "Filter"));
  if (found instanceof Error) {
    // The form keeps what was typed, to fix it; no list, since none matches it. An empty
    // #letters keeps the polls from redrawing the form while it is being fixed.
    setContent(form, el("div", {id: "letters"}), el("div", {id: "detail"}));
    show("error", found.message);
    unknownShown = found.status === 404;
    return;
  }
  // An app the page was opened on before its first run is there now: its "no app" line
  // goes, as an action's refusal does when the next action is asked for.
  if (force || unknownShown) { show("error", ""); unknownShown = false; }
  const filtered = Object.values(filters).some(v => v);
  const bulk = writable && found.letters.length
    ? el("p", {}, filtered ? "Every letter matching the filter: " : "Every letter of the app: ",
         writeButtons(Object.assign({all: true}, filters), filtered ? "every matching letter" : "every letter"))
    : null;
  const shownNote = found.letters.length < found.total
    ? `showing ${found.letters.length} of ${found.total} (filtered or cut at ${found.limit})` : `${found.total} letter(s)`;
  setContent(form, el("p", {class: "muted"}, shownNote), bulk,
    el("div", {id: "letters"}, table(
      ["id", "stream", "handler", "error type", "error", "attempts", "failed at (UTC)", ""],
      found.letters.map(l => [
        el("a", {href: "#" + l.id, class: "letter", onclick: (e) => { e.preventDefault(); detail(l.id); }}, l.id),
        clip(l.namespace + "/" + l.key, CELL_MAX, full(l, "namespace") + 1 + full(l, "key")),
        clip(l.handler || "-", CELL_MAX, full(l, "handler")),
        clip(l.error_type || "-", CELL_MAX, full(l, "error_type")),
        l.error.length > 80 ? l.error.slice(0, 79) + "…" : l.error,
        l.attempts, l.failed_at,
        writeButtons({ids: [l.id]}, "letter " + l.id)]), [5]),
      found.letters.length ? null : el("p", {class: "muted", id: "no-letters"}, "no dead letter")),
    el("div", {id: "detail"}));
}

function groups(data) {
  const st = data.status[app] || Object.values(data.status)[0];
  if (!st) { setContent(el("p", {class: "muted"}, "no consumer group on these queues")); return; }
  // A console shown one app (--app) deletes that app's group only (the server refuses others).
  const deletable = g => writable && (!body.dataset.app || g.group === body.dataset.app);
  const rows = st.groups.map(g => [g.group, ranges(g.queues), num(g.lag),
    g.idle_s === null ? "-" : age(g.idle_s) + " ago", g.members === null ? "-" : g.members,
    ranges(g.holds_retention),
    deletable(g) ? el("button", {type: "button", class: "danger", onclick: async () => {
      if (!confirm(`Delete the consumer group of app ${g.group}? Refused while the app looks alive.`)) return;
      const r = await post("/api/groups/delete", {app: g.group, confirm: true});
      if (r) show("notice", `deleted group ${r.app} from queue(s) ${ranges(r.removed_from)}`);
    }}, "Delete") : ""]);
  setContent(table(["group", "queues", "lag", "last read", "members", "holds retention", ""], rows, [2]),
    el("p", {class: "muted"}, "A group holds retention back while it lags; delete the group of an app that no longer runs."));
}

const RENDER = {overview: overview, daemons: daemons, letters: letters, groups: groups};

function appChoice(data) {
  const names = data.apps.map(a => a.app);
  if (!app && names.length) app = names[0];
  const select = document.getElementById("app");
  if (body.dataset.app || names.length < 2) return;
  document.getElementById("app-choice").hidden = false;
  if (select.options.length !== names.length) {
    select.replaceChildren(...names.map(n => el("option", {value: n, selected: n === app ? "" : null}, n)));
    select.onchange = () => { params.set("app", select.value); location.search = params.toString(); };
  }
}

async function tick() {
  try {
    const data = await getJSON("/api/overview");
    intervalMs = data.interval_s * 1000;
    appChoice(data);
    // A poll clears only what a poll said: an action's refusal stays until the next action.
    if (data.error) { show("error", "the last poll failed: " + data.error); pollFailed = true; }
    else if (pollFailed) { show("error", ""); pollFailed = false; }
    showWarnings(data.warnings || []);
    await RENDER[page](data);
    document.getElementById("updated").textContent =
      "updated " + new Date(data.at * 1000).toLocaleTimeString() + " · every " + data.interval_s + "s";
    body.dataset.polls = String(Number(body.dataset.polls || 0) + 1);
  } catch (e) {
    show("error", e.message);
    pollFailed = true;
  }
  setTimeout(tick, intervalMs);
}

if (writable) {
  const box = document.getElementById("token-box"), input = document.getElementById("token");
  box.hidden = false;
  input.value = sessionStorage.getItem("conveyor-token") || "";
  input.addEventListener("input", () => sessionStorage.setItem("conveyor-token", input.value.trim()));
}
tick();
