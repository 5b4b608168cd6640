// pydledger console: plain JavaScript, no build step, nothing from other hosts.
// Reads /console/api/* (JSON through the cluster's gRPC APIs); changes
// something only on an explicit action, after the user confirms it.
//
// On a cluster with authentication the page asks the user to sign in and
// signs every request as the CLI signs its calls (RocketMQ 5's
// MQv2-HMAC-SHA1 over x-mq-date-time), with WebCrypto: the secret becomes a
// non-extractable key held in this tab's memory only, and is never sent.
"use strict";

const POLL_MS = 2000;
const HISTORY = 150;           // points kept per chart line
const state = {
  page: "cluster",
  lag: {}, term: {},           // node id -> [[time, value]]
  rate: [], lastTotal: null,   // topics: [[time, messages per second]]
  group: null, groupLag: [],   // the group shown in detail, and its lag over time
};
// Who signs the requests: required by the cluster (sign-in mode), the user's
// name, its type (Super or Normal) and the HMAC key made from the secret.
const auth = {required: false, user: "", type: "", key: null};

// ------------------------------------------------------------------ helpers
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props || {})) {
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setStatus(text, isError) {
  const status = document.getElementById("status");
  status.textContent = text;
  status.className = isError ? "status error" : "status";
}

// The request signature: x-mq-date-time (UTC, 20261126T120000Z) and the hex
// HMAC-SHA1 of it keyed by the secret, as dledger/rpc/credentials.py makes it.
async function signedHeaders() {
  if (!auth.key) return {};
  const dateTime = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+/, "");
  const mac = await crypto.subtle.sign("HMAC", auth.key, new TextEncoder().encode(dateTime));
  const hex = Array.from(new Uint8Array(mac), b => b.toString(16).padStart(2, "0")).join("");
  return {
    "X-Mq-Date-Time": dateTime,
    "Authorization": `MQv2-HMAC-SHA1 Credential=${auth.user}, SignedHeaders=x-mq-date-time, Signature=${hex}`,
  };
}

async function answerOf(response) {
  const data = await response.json();
  if (response.status === 401 && auth.required) {
    showSignIn(data.error);
  }
  if (!response.ok) throw new Error(`${data.code || response.status}: ${data.error}`);
  return data;
}

async function api(name, params) {
  const query = new URLSearchParams(params || {}).toString();
  return answerOf(await fetch(`api/${name}${query ? "?" + query : ""}`, {headers: await signedHeaders()}));
}

async function act(name, body) {
  return answerOf(await fetch(`api/${name}`, {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-Console-Action": "confirmed", ...await signedHeaders()},
    body: JSON.stringify(body),
  }));
}

function iso(ms) {
  return ms > 0 ? new Date(ms).toISOString() : "-";
}

// '' -> null; digits -> ms; anything else through Date.parse (ISO 8601).
function parseTime(text) {
  const value = text.trim();
  if (value === "") return null;
  if (/^\d+$/.test(value)) return Number(value);
  const ms = Date.parse(value);
  if (Number.isNaN(ms)) throw new Error(`not a time: ${value} (use 2026-11-25T18:00:00Z or ms since the epoch)`);
  return ms;
}

function fillTable(table, columns, rows, rowClass, onClick) {
  table.replaceChildren(el("tr", {}, columns.map(c => el("th", {}, c.title))));
  for (const row of rows) {
    const tr = el("tr", {class: (rowClass ? rowClass(row) : "") + (onClick ? " clickable" : "")},
      columns.map(c => el("td", {class: c.number ? "number" : ""}, c.value(row))));
    if (onClick) tr.addEventListener("click", () => onClick(row));
    table.append(tr);
  }
}

function remember(series, key, time, value) {
  const points = series[key] || (series[key] = []);
  points.push([time, value]);
  if (points.length > HISTORY) points.shift();
}

// A small line chart as SVG: series is {name: [[time, value], ...]}.
const COLORS = ["#2f6fdf", "#d9822b", "#2e9e5b", "#b03a8f", "#6b6b6b", "#8c564b"];
function drawChart(container, series, width = 460, height = 160) {
  const svgNS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(svgNS, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const pad = {left: 44, right: 90, top: 8, bottom: 18};
  const points = Object.values(series).flat();
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(svgNS, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  if (points.length === 0) {
    add("text", {x: 10, y: height / 2}, "waiting for data…");
    container.replaceChildren(svg);
    return;
  }
  const times = points.map(p => p[0]), values = points.map(p => p[1]);
  const t0 = Math.min(...times), t1 = Math.max(...times, t0 + 1);
  const v1 = Math.max(...values, 1), v0 = Math.min(0, ...values);
  const x = t => pad.left + (t - t0) / (t1 - t0) * (width - pad.left - pad.right);
  const y = v => height - pad.bottom - (v - v0) / (v1 - v0) * (height - pad.top - pad.bottom);
  add("line", {x1: pad.left, y1: y(v0), x2: width - pad.right, y2: y(v0), stroke: "#ccd"});
  add("text", {x: 4, y: y(v1) + 8}, String(Math.round(v1 * 100) / 100));
  add("text", {x: 4, y: y(v0)}, String(v0));
  add("text", {x: pad.left, y: height - 4}, `${Math.round((t1 - t0) / 1000)} s`);
  Object.entries(series).forEach(([name, line], i) => {
    const color = COLORS[i % COLORS.length];
    if (line.length > 0) {
      add("polyline", {points: line.map(p => `${x(p[0])},${y(p[1])}`).join(" "), fill: "none", stroke: color,
                       "stroke-width": 1.5});
    }
    add("text", {x: width - pad.right + 6, y: pad.top + 12 + i * 13, fill: color}, name);
  });
  container.replaceChildren(svg);
}

// ------------------------------------------------------------------ cluster
async function refreshCluster() {
  const data = await api("cluster");
  document.getElementById("cluster-group").textContent = `(group ${data.group})`;
  document.getElementById("leader").textContent = data.leader || "none";
  document.getElementById("term").textContent = data.term ?? "-";
  fillTable(document.getElementById("nodes"), [
    {title: "node", value: n => n.id || "?"},
    {title: "address", value: n => n.address},
    {title: "role", value: n => n.role},
    {title: "term", value: n => n.term ?? "-", number: true},
    {title: "leader", value: n => n.leader_id || "-"},
    {title: "begin", value: n => n.ledger_begin_index ?? "-", number: true},
    {title: "end", value: n => n.ledger_end_index ?? "-", number: true},
    {title: "committed", value: n => n.committed_index ?? "-", number: true},
    {title: "applied", value: n => n.applied_index ?? "-", number: true},
    {title: "lag", value: n => n.lag ?? "-", number: true},
  ], data.nodes, n => n.role === "LEADER" ? "leader" : n.role === "unreachable" ? "unreachable" : "");
  const now = Date.now();
  for (const node of data.nodes) {
    if (node.role !== "LEADER" && node.lag !== null && node.lag !== undefined) remember(state.lag, node.id, now, node.lag);
    if (node.term !== null) remember(state.term, node.id, now, node.term);
  }
  drawChart(document.getElementById("chart-lag"), state.lag);
  drawChart(document.getElementById("chart-term"), state.term);
}

// ------------------------------------------------------------------- topics
async function refreshTopics() {
  const all = document.getElementById("topics-all").checked;
  const data = await api("topics", all ? {all: "1"} : {});
  fillTable(document.getElementById("topics"), [
    {title: "topic", value: t => t.topic},
    {title: "type", value: t => t.type},
    {title: "permission", value: t => t.permission},
    {title: "queues", value: t => t.queues, number: true},
    {title: "messages", value: t => t.messages, number: true},
    {title: "queue offsets (min..max)", value: t => t.offsets.map(q => `${q.queue_id}: ${q.min_offset}..${q.max_offset}`).join("  ")},
  ], data.topics);
  const total = data.topics.reduce((sum, t) => sum + t.offsets.reduce((s, q) => s + q.max_offset, 0), 0);
  const now = Date.now();
  if (state.lastTotal !== null && now > state.lastTotal[0]) {
    state.rate.push([now, Math.max(0, (total - state.lastTotal[1]) * 1000 / (now - state.lastTotal[0]))]);
    if (state.rate.length > HISTORY) state.rate.shift();
  }
  state.lastTotal = [now, total];
  drawChart(document.getElementById("chart-rate"), {"msg/s": state.rate});
}

// ------------------------------------------------------------------- groups
async function refreshGroups() {
  const data = await api("groups");
  fillTable(document.getElementById("groups"), [
    {title: "group", value: g => g.group},
    {title: "max retries", value: g => g.max_retries, number: true},
    {title: "fifo", value: g => g.fifo ? "yes" : "no"},
    {title: "lag", value: g => g.total_lag, number: true},
    {title: "in flight", value: g => g.in_flight, number: true},
    {title: "dead letters", value: g => g.dead_letters, number: true},
  ], data.groups, g => g.group === state.group ? "leader" : "", g => showGroup(g.group));
  if (state.group) await refreshProgress();
}

function showGroup(name) {
  if (state.group !== name) state.groupLag = [];
  state.group = name;
  document.getElementById("group-name").textContent = name;
  document.getElementById("group-detail").className = "";
  document.getElementById("reset-result").textContent = "";
  refreshProgress().catch(error => setStatus(error.message, true));
}

async function refreshProgress() {
  const data = await api("progress", {group: state.group});
  fillTable(document.getElementById("progress"), [
    {title: "topic", value: q => q.topic},
    {title: "queue", value: q => q.queue_id, number: true},
    {title: "committed", value: q => q.committed_offset, number: true},
    {title: "max", value: q => q.max_offset, number: true},
    {title: "lag", value: q => q.lag, number: true},
    {title: "in flight", value: q => q.in_flight, number: true},
    {title: "retrying", value: q => q.retrying, number: true},
    {title: "expired", value: q => q.expired, number: true},
    {title: "last consumed", value: q => iso(q.last_consumed_store_ms)},
  ], data.queues);
  const select = document.getElementById("reset-topic");
  const topics = [...new Set(data.queues.map(q => q.topic))];
  if (select.options.length === 0 || [...select.options].map(o => o.value).join() !== topics.join()) {
    const chosen = select.value;
    select.replaceChildren(...topics.map(t => el("option", {value: t}, t)));
    if (topics.includes(chosen)) select.value = chosen;
  }
  state.groupLag.push([Date.now(), data.total_lag]);
  if (state.groupLag.length > HISTORY) state.groupLag.shift();
  drawChart(document.getElementById("chart-group-lag"), {lag: state.groupLag});
}

function showResetFields() {
  const mode = document.getElementById("reset-mode").value;
  for (const label of document.querySelectorAll(".mode-time")) label.className = mode === "time" ? "mode-time" : "mode-time hidden";
  for (const label of document.querySelectorAll(".mode-queue")) label.className = mode === "queue" ? "mode-queue" : "mode-queue hidden";
}

async function submitReset(event) {
  event.preventDefault();
  const result = document.getElementById("reset-result");
  try {
    const topic = document.getElementById("reset-topic").value;
    const mode = document.getElementById("reset-mode").value;
    const body = {group: state.group, topic};
    let what;
    if (mode === "time") {
      body.to_time = parseTime(document.getElementById("reset-time").value);
      if (body.to_time === null) throw new Error("give the time to reset to");
      what = `the first message stored at or after ${iso(body.to_time)}`;
    } else if (mode === "queue") {
      body.queue = document.getElementById("reset-queue").value;
      body.offset = document.getElementById("reset-offset").value;
      what = `offset ${body.offset} of queue ${body.queue}`;
    } else {
      body.to = mode;
      what = `the ${mode} offset of every queue`;
    }
    if (!topic) throw new Error("the group has no topic to reset");
    if (!window.confirm(`Reset group ${state.group} on ${topic} to ${what}? Its consumers follow at once.`)) {
      result.textContent = "reset cancelled";
      return;
    }
    const data = await act("reset", body);
    result.className = "result";
    result.textContent = `reset (entry ${data.entry_index}): ` +
      data.queues.map(q => `queue ${q.queue_id} ${q.previous_offset} → ${q.offset}`).join(", ");
    await refreshProgress();
  } catch (error) {
    result.className = "result error";
    result.textContent = error.message;
  }
}

// ----------------------------------------------------------------- messages
function showSearchFields() {
  const mode = document.getElementById("search-mode").value;
  const shown = {
    key: ["search-topic", "search-key"], id: ["search-topic", "search-id"],
    offset: ["search-topic", "search-queue", "search-offset", "search-count"],
    time: ["search-topic", "search-queue", "search-time", "search-count"],
  }[mode];
  for (const name of ["search-topic", "search-key", "search-id", "search-queue", "search-offset", "search-time", "search-count"]) {
    for (const label of document.querySelectorAll("." + name)) label.className = shown.includes(name) ? name : name + " hidden";
  }
  if (mode === "key") for (const label of document.querySelectorAll(".search-count")) label.className = "search-count";
}

function messageCard(m, resend) {
  const fields = [
    ["offset message id", m.offset_message_id], ["message id", m.message_id], ["tag", m.tag || "-"],
    ["keys", m.keys.join(" ") || "-"], ["born", `${iso(m.born_timestamp_ms)} (${m.born_host})`],
    ["stored", `${iso(m.store_timestamp_ms)} (${m.store_host})`], ["reconsume times", m.reconsume_times],
    ["properties", Object.entries(m.properties).map(([k, v]) => `${k}=${v}`).join("  ")],
  ];
  if (m.delivery) {
    const d = m.delivery;
    fields.push([`group ${d.group}`, d.state.replace(/_/g, " ") + (d.attempts ? `, attempt ${d.attempts}` : "") +
      (d.lease_deadline_ms ? `, lease ends ${iso(d.lease_deadline_ms)}` : "")]);
  }
  return el("div", {class: "message"},
    el("h4", {}, `${m.topic} / queue ${m.queue_id} @ ${m.queue_offset}`),
    el("dl", {}, fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)])),
    el("pre", {}, m.body_text !== null ? m.body_text : `(binary, base64) ${m.body_base64}`),
    resend ? el("button", {class: "resend", onclick: resend}, resend.label) : null);
}

async function submitSearch(event) {
  event.preventDefault();
  const summary = document.getElementById("search-summary");
  const results = document.getElementById("search-results");
  const value = id => document.getElementById(id).value.trim();
  try {
    const mode = value("search-mode");
    const params = {group: value("search-group")};
    if (mode === "key") {
      Object.assign(params, {topic: value("search-topic"), key: value("search-key"), max: value("search-max")});
      const begin = parseTime(value("search-begin")), end = parseTime(value("search-end"));
      if (begin !== null) params.begin = begin;
      if (end !== null) params.end = end;
    } else if (mode === "id") {
      Object.assign(params, {id: value("search-id"), topic: value("search-topic")});
    } else {
      Object.assign(params, {topic: value("search-topic"), queue: value("search-queue"), count: value("search-max")});
      if (mode === "offset") params.offset = value("search-offset");
      else {
        const time = parseTime(value("search-time"));
        if (time === null) throw new Error("give the time to search from");
        params.time = time;
      }
    }
    const data = await api("messages", params);
    summary.className = "result";
    summary.textContent = `${data.messages.length} message(s) found`;
    const group = params.group;
    results.replaceChildren(...data.messages.map(m => messageCard(m, group ? resendButton(m, group) : null)));
  } catch (error) {
    summary.className = "result error";
    summary.textContent = error.message;
    results.replaceChildren();
  }
}

function resendButton(m, group) {
  const resend = async () => {
    if (!window.confirm(`Deliver ${m.topic}/${m.queue_id}@${m.queue_offset} once more to group ${group}?`)) return;
    const summary = document.getElementById("search-summary");
    try {
      const data = await act("resend", {id: m.offset_message_id, group});
      summary.className = "result";
      summary.textContent = `resent to ${group} (entry ${data.entry_index})`;
    } catch (error) {
      summary.className = "result error";
      summary.textContent = error.message;
    }
  };
  resend.label = `Resend to ${group}…`;
  return resend;
}

// ------------------------------------------------------------- dead letters
async function submitDeadLetters(event) {
  if (event) event.preventDefault();
  const group = document.getElementById("dlq-group").value.trim();
  const summary = document.getElementById("dlq-summary");
  const results = document.getElementById("dlq-results");
  try {
    const data = await api("dead-letters", {group});
    summary.className = "result";
    summary.textContent = `${data.messages.length} dead letter(s) of ${group}`;
    results.replaceChildren(...data.messages.map(m => {
      const resend = async () => {
        if (!window.confirm(`Deliver the original of this dead letter once more to group ${group}?`)) return;
        try {
          const answer = await act("dead-letters/resend", {group, id: m.offset_message_id});
          summary.className = "result";
          summary.textContent = `resent ${answer.message.topic}/${answer.message.queue_id}@${answer.message.queue_offset} to ${group}`;
        } catch (error) {
          summary.className = "result error";
          summary.textContent = error.message;
        }
      };
      resend.label = `Resend to ${group}…`;
      return messageCard(m, resend);
    }));
  } catch (error) {
    summary.className = "result error";
    summary.textContent = error.message;
    results.replaceChildren();
  }
}

// ------------------------------------------------------------------- sign-in
function showSignIn(message) {
  auth.key = null;
  auth.user = auth.type = "";
  document.getElementById("signin").className = "signin";
  document.getElementById("main").className = "hidden";
  document.getElementById("signout").className = "hidden";
  document.getElementById("whoami").textContent = "";
  document.getElementById("signin-error").textContent = message || "";
}

function showSignedIn() {
  document.getElementById("signin").className = "signin hidden";
  document.getElementById("main").className = "";
  document.getElementById("whoami").textContent = auth.user ? `${auth.user} (${auth.type})` : "";
  document.getElementById("signout").className = auth.required ? "" : "hidden";
  showPage();
}

async function submitSignIn(event) {
  event.preventDefault();
  const error = document.getElementById("signin-error");
  const user = document.getElementById("signin-user").value.trim();
  const secretInput = document.getElementById("signin-secret");
  try {
    if (!window.isSecureContext || !window.crypto || !crypto.subtle) {
      throw new Error("this browser offers no WebCrypto on this page: it is not a secure context (plain http " +
        "from another host). Open the console through an SSH tunnel as http://127.0.0.1:PORT/console/ " +
        "(ssh -L PORT:127.0.0.1:PORT HOST), or run `dledger console` on your machine");
    }
    if (!user || !secretInput.value) throw new Error("give a user and its secret");
    auth.user = user;
    auth.key = await crypto.subtle.importKey("raw", new TextEncoder().encode(secretInput.value.trim()),
                                             {name: "HMAC", hash: "SHA-1"}, false, ["sign"]);
    secretInput.value = "";
    const me = await api("whoami");
    auth.type = me.type;
    error.textContent = "";
    showSignedIn();
  } catch (failure) {
    auth.key = null;
    error.textContent = failure.message;
  }
}

// ---------------------------------------------------------- users and ACLs
async function refreshUsers() {
  const isSuper = auth.type === "Super";
  document.getElementById("users-mode").textContent = isSuper
    ? `${auth.user} is a super user: users and ACLs can be changed here (each change asks first).`
    : "Read-only: only a super user changes users and ACLs.";
  for (const form of document.querySelectorAll(".super-only")) form.className = isSuper ? "form super-only" : "form super-only hidden";
  const users = await api("users");
  const userColumns = [{title: "user", value: u => u.name}, {title: "type", value: u => u.type}];
  if (isSuper) userColumns.push({title: "", value: u => el("button", {class: "delete-user", onclick: () => deleteUser(u.name)}, "Delete…")});
  fillTable(document.getElementById("users"), userColumns, users.users);
  const acls = await api("acls");
  const rows = acls.acls.flatMap(a => a.entries.map(e => ({subject: a.subject, ...e})));
  const aclColumns = [
    {title: "subject", value: r => r.subject}, {title: "resource", value: r => r.resource},
    {title: "actions", value: r => r.actions.join(",")}, {title: "decision", value: r => r.decision},
    {title: "source IPs", value: r => r.source_ips.join(",") || "any"},
  ];
  if (isSuper) aclColumns.push({title: "", value: r => el("button", {class: "delete-acl", onclick: () => deleteAcl(r.subject, r.resource)}, "Delete…")});
  fillTable(document.getElementById("acls"), aclColumns, rows);
}

async function change(question, name, body, done) {
  const result = document.getElementById("users-result");
  if (!window.confirm(question)) {
    result.className = "result";
    result.textContent = "cancelled";
    return;
  }
  try {
    await act(name, body);
    result.className = "result";
    result.textContent = done;
    await refreshUsers();
  } catch (error) {
    result.className = "result error";
    result.textContent = error.message;
  }
}

async function submitUser(event) {
  event.preventDefault();
  const name = document.getElementById("user-name").value.trim();
  const secret = document.getElementById("user-secret");
  const type = document.getElementById("user-type").value;
  const body = {name, secret: secret.value, type};
  secret.value = "";
  await change(`Create the ${type} user ${name}?`, "users/create", body, `user ${name} created`);
}

function deleteUser(name) {
  return change(`Delete user ${name} and its ACL? Its clients are refused at once.`, "users/delete", {name},
                `user ${name} deleted`);
}

async function submitAcl(event) {
  event.preventDefault();
  const value = id => document.getElementById(id).value.trim();
  const body = {subject: value("acl-subject"), resource: value("acl-resource"), actions: value("acl-actions"),
                decision: value("acl-decision"), source_ips: value("acl-ips")};
  await change(`${body.decision} ${body.actions} on ${body.resource} to ${body.subject}?`, "acls/create", body,
               `ACL entry added to ${body.subject}`);
}

function deleteAcl(subject, resource) {
  return change(`Delete the entry for ${resource} from ${subject}'s ACL?`, "acls/delete", {subject, resource},
                `ACL entry of ${resource} removed from ${subject}`);
}

// ------------------------------------------------------------------ routing
const REFRESH = {cluster: refreshCluster, topics: refreshTopics, groups: refreshGroups, users: refreshUsers};

function showPage() {
  const page = (location.hash || "#cluster").slice(1);
  state.page = document.getElementById(`page-${page}`) ? page : "cluster";
  for (const section of document.querySelectorAll(".page")) {
    section.className = section.id === `page-${state.page}` ? "page active" : "page";
  }
  for (const link of document.querySelectorAll("nav a")) {
    link.className = link.id === `nav-${state.page}` ? "active" : "";
  }
  refresh();
}

let refreshing = false;
async function refresh() {
  const action = REFRESH[state.page];
  if (!action || refreshing || document.hidden || (auth.required && !auth.key)) return;
  refreshing = true;
  try {
    await action();
    setStatus(`updated ${new Date().toLocaleTimeString()}`, false);
  } catch (error) {
    setStatus(error.message, true);
  } finally {
    refreshing = false;
  }
}

async function start() {
  const config = await (await fetch("api/config")).json();
  auth.required = config.sign_in;
  if (auth.required) {
    showSignIn("");
    return;
  }
  try {
    const me = await api("whoami");   // an operator's credentials given to `dledger console`, or none
    auth.user = me.user;
    auth.type = me.type;
  } catch (error) {
    setStatus(error.message, true);
  }
  showSignedIn();
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("signin-form").addEventListener("submit", submitSignIn);
  document.getElementById("signout").addEventListener("click", () => showSignIn("signed out"));
  document.getElementById("user-form").addEventListener("submit", submitUser);
  document.getElementById("acl-form").addEventListener("submit", submitAcl);
  document.getElementById("reset-form").addEventListener("submit", submitReset);
  document.getElementById("reset-mode").addEventListener("change", showResetFields);
  document.getElementById("search-form").addEventListener("submit", submitSearch);
  document.getElementById("search-mode").addEventListener("change", showSearchFields);
  document.getElementById("dlq-form").addEventListener("submit", submitDeadLetters);
  document.getElementById("topics-all").addEventListener("change", refresh);
  showResetFields();
  showSearchFields();
  window.addEventListener("hashchange", showPage);
  setInterval(refresh, POLL_MS);
  start().catch(error => setStatus(error.message, true));
});
