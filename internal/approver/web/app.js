// The page of `propio-sandbox ui`: the board's snapshots arrive as
// server-sent events; decisions are posted as JSON to api/decide. Every URL
// is relative, so it carries the token of the page's path. Data is only
// ever put in the page as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

// inert shows the characters that would reorder or hide text (the C0 and C1
// controls, DEL, the bidi and other format characters, the line
// separators) as escapes, as the terminal frontends do (internal/termsafe).
const named = { "\x07": "\\a", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\v": "\\v", "\f": "\\f", "\r": "\\r" };
function inert(s) {
  return String(s).replace(/[\p{Cc}\p{Cf}\u2028\u2029]/gu, (c) => {
    const n = c.codePointAt(0);
    if (named[c]) return named[c];
    if (n < 0x80) return "\\x" + n.toString(16).padStart(2, "0");
    return n > 0xffff ? "\\U" + n.toString(16).padStart(8, "0") : "\\u" + n.toString(16).padStart(4, "0");
  });
}

// el makes an element; text children are put in inert, as text.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(typeof c === "string" ? inert(c) : c);
  return e;
}

function dest(host, port) {
  if (!port) return host;
  return (host.includes(":") ? "[" + host + "]" : host) + ":" + port;
}

// what says what a request asks for: host:port, or an agent's port,
// resources or host path (as the CLI's requests says it).
function what(r) {
  switch (r.kind) {
    case "port": return "port " + r.port;
    case "resources": {
      const x = r.resources || {}, parts = [];
      if (x.cpus) parts.push("cpus " + x.cpus);
      if (x.memory) parts.push("memory " + (x.memory / 1073741824).toFixed(1) + "GiB");
      if (x.pids) parts.push("pids " + x.pids);
      return "resources " + parts.join(", ");
    }
    case "mount": {
      // The path the launcher copies (resolved), beside the one asked for
      // when they differ: MountAsk.Path.
      const m = r.mount || {}, src = m.source || "", res = m.resolved || "";
      const path = !res ? src : res === src ? res : src + " \u2192 " + res;
      return "mount " + path + (m.target ? " at " + m.target : "") + (m.write ? ", write" : "");
    }
  }
  return dest(r.host, r.port);
}

function clock(t) {
  const d = new Date(t);
  return isNaN(d) || d.getFullYear() < 2000 ? "" : d.toLocaleTimeString();
}

let state = null;

const choices = [
  ["allow", "once", "Allow once"],
  ["allow", "run", "Allow for this run"],
  ["allow", "always", "Allow always"],
  ["deny", "once", "Deny"],
  ["deny", "run", "Deny for this run"],
  ["deny", "always", "Deny always"],
];

// decide posts the decision for req, the request the button was drawn
// for: its id, never whichever request is at that place now.
async function decide(req, action, scope, li) {
  for (const b of li.querySelectorAll("button")) b.disabled = true;
  try {
    const resp = await fetch("api/decide", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sandbox: req.project, id: req.id, action, scope }),
    });
    if (!resp.ok) showError((await resp.text()).trim());
  } catch (e) {
    showError(String(e));
  }
  if (!li.classList.contains("gone")) for (const b of li.querySelectorAll("button")) b.disabled = false;
  refreshLogs();
}

function showError(msg) {
  $("error").textContent = inert(msg);
  $("error").hidden = !msg;
}

// The pending list never moves under the pointer: a request's entry is
// drawn once and kept in its place; one that is no longer pending (its
// timeout, or another approver, decided it) stays where it was, its
// buttons disabled, while the pointer or the focus is in the list, and
// goes when they leave it. New requests are added at the end. So a click
// in flight as the list changes lands on the request it was aimed at, or
// on a disabled button: it never decides the request that took its place.
const rows = new Map(); // project/id -> {li, gone}

function pendingRow(s, r) {
  const li = el("li", { class: "request", "data-id": r.id, "data-sandbox": r.project });
  li.append(
    el("div", { class: "dest mono" }, what(r)),
    el("div", { class: "meta" }, `${r.kind} via ${r.via} · sandbox ${r.project} · ${r.reason} · asked at ${clock(r.created)}`),
  );
  const buttons = el("div", { class: "buttons" });
  for (const [action, scope, label] of choices) {
    if (scope === "always" && (!s.always || (r.kind && r.kind !== "network"))) continue; // an agent's request is decided for itself
    const b = el("button", { class: action + (scope === "run" && action === "allow" ? " primary" : ""), "data-action": action, "data-scope": scope, type: "button" }, label);
    b.addEventListener("click", () => decide(r, action, scope, li));
    buttons.append(b);
  }
  li.append(buttons);
  return li;
}

function holding() {
  const ul = $("pending");
  return ul.matches(":hover") || ul.contains(document.activeElement);
}

function renderPending(s) {
  const ul = $("pending");
  const now = new Set();
  for (const it of s.pending) {
    const r = it.request, k = r.project + "/" + r.id;
    now.add(k);
    if (!rows.has(k)) {
      const li = pendingRow(s, r);
      rows.set(k, { li, gone: false });
      ul.append(li);
    }
  }
  const hold = holding();
  for (const [k, row] of rows) {
    if (now.has(k)) continue;
    if (!hold) {
      row.li.remove();
      rows.delete(k);
    } else if (!row.gone) {
      row.gone = true;
      row.li.classList.add("gone");
      for (const b of row.li.querySelectorAll("button")) b.disabled = true;
      row.li.append(el("div", { class: "meta" }, "no longer pending"));
    }
  }
  $("pending-count").textContent = String(s.pending.length);
  $("pending-empty").hidden = s.pending.length > 0;
}

// The entries that went are taken away once the pointer and the focus
// have left the list.
for (const type of ["mouseleave", "focusout"]) {
  $("pending").addEventListener(type, () => setTimeout(() => { if (state && !holding()) renderPending(state); }, 0));
}

function renderDecided(s) {
  const body = $("decided").tBodies[0];
  body.replaceChildren();
  for (const it of s.decided) {
    const r = it.request, d = it.decision || {};
    body.append(el("tr", { "data-id": r.id, "data-sandbox": r.project },
      el("td", {}, clock(it.decided)),
      el("td", { class: d.action || "" }, d.action || ""),
      el("td", {}, d.scope || ""),
      el("td", {}, it.decided_by || ""),
      el("td", { class: "mono" }, what(r)),
      el("td", {}, r.via),
      el("td", {}, r.project)));
  }
}

function render(s) {
  state = s;
  const names = s.sandboxes.map((x) => x.project + " (" + x.workspace + ")");
  $("sandboxes").textContent = names.length ? "Approving for " + inert(names.join(", ")) : "No sandbox that can ask is running here yet; waiting for one.";
  showError(s.error || "");
  renderPending(s);
  renderDecided(s);
}

function outcome(e) {
  if (!e.allowed) return "denied";
  return e.error ? "failed" : "allowed";
}

async function refreshLogs() {
  if (!state) return;
  const box = $("logs");
  const parts = [];
  for (const sb of state.sandboxes) {
    let entries = [];
    try {
      const resp = await fetch("api/log?sandbox=" + encodeURIComponent(sb.project));
      if (resp.ok) entries = await resp.json();
    } catch (e) { /* the next refresh tries again */ }
    const table = el("table", { class: "log" },
      el("thead", {}, el("tr", {}, ...["time", "decision", "by", "scope", "via", "destination", "why"].map((h) => el("th", {}, h)))));
    const body = el("tbody");
    for (const e of entries) {
      body.append(el("tr", {},
        el("td", {}, clock(e.time)),
        el("td", { class: outcome(e) }, outcome(e)),
        el("td", {}, e.decided_by || "rule"), // as logs says it: entries without one were decided by the rules
        el("td", {}, e.scope || ""),
        el("td", {}, e.via),
        el("td", { class: "mono" }, e.kind ? e.kind + " " + (e.asked || "") : dest(e.host, e.port)),
        el("td", {}, e.reason + (e.error ? " (" + e.error + ")" : ""))));
    }
    table.append(body);
    parts.push(el("h3", {}, sb.project), entries.length ? table : el("p", { class: "muted" }, "no decisions logged yet"));
  }
  box.replaceChildren(...parts);
}

const events = new EventSource("api/events");
events.onmessage = (m) => { render(JSON.parse(m.data)); refreshLogs(); };
events.onerror = () => { $("sandboxes").textContent = "disconnected from propio-sandbox ui; reconnecting…"; };
setInterval(refreshLogs, 2000);
