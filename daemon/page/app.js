// The daemon's web page: plain JavaScript, no build step. It uses the same API as every
// client (docs/daemon.md) with the same token, which it takes from the URL's fragment
// (#token=..., never sent to a server) or a form, and keeps in this tab's sessionStorage.
// Everything shown is set as text, never as HTML. This file: the API, one session's live
// view and the start; list.js the session list; changes.js the Changes and Actions views
// (the audit trail, and a fork from an action) and the tabs.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { token: null, current: null, socket: null, after: 0, actions: new Map(),
                info: null, timer: null, reconnect: null, detailPending: false,
                detailAgain: false };

function takeToken() {
  const match = /(?:^#|&)token=([^&]+)/.exec(location.hash);
  if (match) {
    sessionStorage.setItem("trouper.token", decodeURIComponent(match[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("trouper.token");
}

async function api(method, path, body, headers) {
  const options = { method, headers: { Authorization: "Bearer " + state.token, ...headers } };
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const answer = await fetch(path, options);
  const data = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    const err = (data && data.error) || {};
    const e = new Error(err.message || ("HTTP " + answer.status));
    e.status = answer.status;
    throw e;
  }
  return data;
}

const RETRY_MS = 15000;
const COMMANDS = ["pause", "resume", "stop", "approve", "reject"];
// state changes told by the action itself (waiting, then its answer): no line of their own
const ON_THE_ACTION = new Set(["awaiting_confirmation", "user_approve", "user_reject"]);

function newKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// A POST whose connection failed (a dropped connection, the daemon restarting) is sent
// again: under one Idempotency-Key (a command) or one session id (a create) the daemon
// carries it out once. An answer from the daemon (e.status) is never sent again.
async function apiAgain(method, path, body, headers) {
  const deadline = Date.now() + RETRY_MS;
  let wait = 100;
  for (;;) {
    try {
      return await api(method, path, body, headers);
    } catch (e) {
      if (e.status !== undefined || Date.now() + wait > deadline) throw e;
      await new Promise((resolve) => setTimeout(resolve, wait));
      wait = Math.min(1000, wait * 2);
    }
  }
}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}

// -- one session, live ----------------------------------------------------------------------

function select(id) {
  if (state.socket) { state.socket.onclose = null; state.socket.close(); }
  clearTimeout(state.reconnect);
  Object.assign(state, { current: id, after: 0, actions: new Map(), info: null, socket: null });
  $("no-session").hidden = true;
  $("session").hidden = false;
  $("session-id").textContent = id;
  $("events").replaceChildren();
  $("command-error").textContent = "";
  for (const name of COMMANDS) $(name).disabled = true;  // until the session is read
  for (const item of $("sessions").children) {
    item.classList.toggle("selected", item.dataset.id === id);
  }
  clearChanges();
  clearActions();
  refreshDetail();
  refreshChanges();
  refreshActions();
  connect();
}

function connect() {
  const id = state.current;
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const url = scheme + location.host + "/v1/sessions/" + encodeURIComponent(id) +
              "/events/ws?after=" + state.after;
  // browsers set no headers on a WebSocket: the token goes as a subprotocol
  const socket = new WebSocket(url, ["trouper.v1", "bearer." + state.token]);
  state.socket = socket;
  socket.onmessage = (message) => {
    const data = JSON.parse(message.data);
    if (data.type === "event" && data.seq > state.after) {
      state.after = data.seq;
      show(data.event);
    }
  };
  socket.onclose = () => {
    if (state.current !== id || state.socket !== socket) return;
    // the daemon restarted, or this tab was too slow: carry on from the last seq shown
    state.reconnect = setTimeout(connect, 1000);
  };
}

async function refreshDetail() {
  // one request at a time; a call meanwhile asks for one more read after it (never lost)
  if (!state.current) return;
  if (state.detailPending) { state.detailAgain = true; return; }
  state.detailPending = true;
  try {
    do {
      state.detailAgain = false;
      const info = await api("GET", "/v1/sessions/" + encodeURIComponent(state.current));
      if (info.id === state.current) render(info);
    } while (state.detailAgain);
  } catch (e) {
    $("command-error").textContent = e.message;
  } finally {
    state.detailPending = false;
  }
}

function render(info) {
  state.info = info;
  const badge = $("state");
  badge.textContent = info.state;
  badge.className = "state " + info.state;
  badge.dataset.state = info.state;
  $("reason").textContent = info.reason || "";
  $("cost").textContent = "$" + Number(info.cost_usd || 0).toFixed(4);
  $("steps").textContent = String(info.iterations);
  const waiting = info.awaiting_confirmation;
  $("pending").hidden = !waiting;
  $("pending").dataset.actionId = waiting ? waiting.action_id : "";
  $("pending-action").textContent = waiting ? describe(waiting) : "";
  // paused for a spent budget (on_budget "ask"): the form raises it, the session goes on
  const asking = info.state === "paused" && info.cause === "budget_ask";
  if (asking && $("budget").hidden) {
    $("budget-cost").value = info.config.max_cost_usd || "";
    $("budget-iterations").value = info.config.max_iterations || "";
  }
  $("budget").hidden = !asking;
  // a button works only where the session's table has a row for it (info.commands)
  const can = new Set(info.commands || []);
  for (const name of COMMANDS) $(name).disabled = !can.has(name);
  tick();
}

function tick() {
  const info = state.info;
  const at = info && info.resumes_at && ["rate_limited", "error"].includes(info.state)
    ? Date.parse(info.resumes_at) : null;
  $("countdown").textContent = at === null ? ""
    : "resumes in " + Math.max(0, Math.ceil((at - Date.now()) / 1000)) + " s";
}

// {"text": "hi"}: an MCP call's arguments as JSON, spaced for reading
function argumentsText(args) {
  const entries = Object.entries(args || {});
  return "{" + entries.map(([k, v]) => JSON.stringify(k) + ": " + JSON.stringify(v))
    .join(", ") + "}";
}

function describe(action) {
  const a = action.action;
  if (a && a.kind === "mcp") return "mcp " + a.server + "." + a.tool + " " + argumentsText(a.arguments);
  if (a && a.kind === "mcp_tools") {
    return "start MCP servers: " + (a.servers || []).map((s) => s.name).join(", ");
  }
  if (a && a.command !== undefined) return "$ " + a.command;
  if (a && a.path !== undefined) return action.tool + " " + a.path;
  return action.tool + " " + action.arguments;
}

function show(event) {
  const list = $("events");
  const add = (node) => { node.dataset.seq = event.seq; list.append(node); };
  switch (event.kind) {
    case "message":
      add(el("li", "msg-" + event.source, event.text));
      break;
    case "action": {
      const item = el("li", "action");
      item.dataset.actionId = event.action_id;
      if (event.thought) item.append(el("div", "muted", event.thought));
      item.append(el("span", "tool", describe(event)));
      state.actions.set(event.action_id, item);
      add(item);
      refreshActions();  // read only while the Actions tab is open
      break;
    }
    case "observation": {
      const o = event.outcome;
      const text = o.status + (o.exit_code !== null && o.exit_code !== undefined
        ? " (exit " + o.exit_code + ")" : "") + (o.content ? ": " + o.content : "");
      const node = el("pre", "outcome " + o.status, text);
      node.dataset.status = o.status;
      const action = state.actions.get(event.action_id);
      if (action) action.append(node); else add(el("li", "status", text));
      refreshChanges();  // an action ran: the workspace may differ (read if the tab is open)
      refreshActions();
      break;
    }
    case "state":
      // waiting for approval, and the answer, show on the action (the box above, then
      // "approved by you" or its "rejected" outcome), not as lines in between
      if (!ON_THE_ACTION.has(event.cause)) {
        add(el("li", "status", "state: " + event.state + (event.reason ? " (" + event.reason + ")" : "")));
      }
      refreshDetail();
      refreshSessions();
      refreshChanges();
      refreshActions();
      break;
    case "llm_retry":
      add(el("li", "status", "model call failed (" + event.error_class + "), attempt " +
        event.attempt + "/" + event.max_attempts + " in " + event.wait_s.toFixed(1) + " s"));
      break;
    case "runtime":
      refreshActions();  // a sandbox came up again: an action in flight is asked about
      if (event.phase !== "started" && event.phase !== "attached") {
        add(el("li", "status", "sandbox " + event.phase + (event.detail ? ": " + event.detail : "")));
      }
      break;
    case "confirmation": {
      // an answer belongs to its action: a rejection is its "rejected" outcome, which
      // follows; an approval is noted on it. Never an entry of its own.
      const action = state.actions.get(event.action_id);
      if (action) {
        action.dataset.answer = event.approved ? "approved" : "rejected";
        if (event.approved) action.append(el("div", "answer muted", "approved by you"));
      }
      refreshDetail();
      break;
    }
    case "mcp_tools":
      for (const node of mcpToolsLines(event)) add(node);
      break;
    case "llm_completed":
      refreshDetail();
      break;
    default:
      break;
  }
  list.lastElementChild && event.kind !== "llm_completed" &&
    list.lastElementChild.scrollIntoView({ block: "nearest" });
}

// The MCP servers' tools, a line per server ("MCP t: 2 tools (echo, env)"), and each
// server that did not start with why, as a warning.
function mcpToolsLines(event) {
  const offered = new Map();
  for (const tool of event.tools || []) {
    if (!offered.has(tool.server)) offered.set(tool.server, []);
    offered.get(tool.server).push(tool.tool);
  }
  const lines = [];
  for (const [server, tools] of offered) {
    const node = el("li", "status mcp-tools", "MCP " + server + ": " + tools.length +
      (tools.length === 1 ? " tool (" : " tools (") + tools.join(", ") + ")");
    node.dataset.server = server;
    lines.push(node);
  }
  for (const [server, why] of Object.entries(event.failed || {})) {
    const node = el("li", "status warning", "MCP server " + server + " did not start: " + why);
    node.dataset.server = server;
    lines.push(node);
  }
  if (!lines.length) lines.push(el("li", "status mcp-tools", "MCP: no tools offered"));
  return lines;
}

async function command(name, body) {
  $("command-error").textContent = "";
  try {
    await apiAgain("POST", "/v1/sessions/" + encodeURIComponent(state.current) + "/" + name,
                   body, { "Idempotency-Key": newKey() });
  } catch (e) {
    $("command-error").textContent = e.message;
  }
  refreshDetail();
  refreshSessions();
}

// -- starting a session ------------------------------------------------------------------

async function startSession(event) {
  event.preventDefault();
  $("new-error").textContent = "";
  const llm = { model: $("new-model").value.trim() };
  if ($("new-base-url").value.trim()) llm.base_url = $("new-base-url").value.trim();
  if ($("new-api-key").value) llm.api_key = $("new-api-key").value;
  const body = { task: $("new-task").value, llm, confirm: $("new-confirm").value,
                 max_iterations: Number($("new-max-iterations").value || 50) };
  if ($("new-workspace").value.trim()) body.workspace = $("new-workspace").value.trim();
  body.id = "s-" + newKey().slice(0, 12);  // named here: safe to send again
  try {
    const made = await apiAgain("POST", "/v1/sessions", body);
    $("new-task").value = "";
    await refreshSessions();
    select(made.id);
  } catch (e) {
    $("new-error").textContent = e.message;
  }
}

// -- start -----------------------------------------------------------------------------

function logout(why) {
  sessionStorage.removeItem("trouper.token");
  state.token = null;
  clearInterval(state.timer);
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = why || "";
}

function begin() {
  $("login").hidden = true;
  $("app").hidden = false;
  refreshSessions();
  clearInterval(state.timer);
  state.timer = setInterval(() => { refreshSessions(); tick(); tickAges(); }, 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem("trouper.token", $("token-input").value.trim());
    state.token = sessionStorage.getItem("trouper.token");
    $("token-input").value = "";
    begin();
  });
  $("new-form").addEventListener("submit", startSession);
  $("message-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("message").value;
    $("message").value = "";
    command("messages", { text });
  });
  $("budget").addEventListener("submit", (event) => {
    event.preventDefault();
    const cost = $("budget-cost").value, iterations = $("budget-iterations").value;
    command("budget", {
      max_cost_usd: cost === "" ? null : Number(cost),
      max_iterations: iterations === "" ? null : Number(iterations),
    });
  });
  $("pause").addEventListener("click", () => command("pause"));
  $("resume").addEventListener("click", () => command("resume"));
  $("stop").addEventListener("click", () => command("stop"));
  $("tab-events").addEventListener("click", () => showTab("events"));
  $("tab-changes").addEventListener("click", () => showTab("changes"));
  $("changes-refresh").addEventListener("click", refreshChanges);
  $("tab-actions").addEventListener("click", () => showTab("actions"));
  $("actions-refresh").addEventListener("click", refreshActions);
  $("approve").addEventListener("click",
    () => command("approve", { action_id: $("pending").dataset.actionId || "" }));
  $("reject").addEventListener("click", () => {
    const reason = $("reject-reason").value;
    $("reject-reason").value = "";
    command("reject", { action_id: $("pending").dataset.actionId || "", reason });
  });
  state.token = takeToken();
  if (state.token) begin(); else logout();
});
