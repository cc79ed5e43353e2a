// The session list: a row a session (state, task, id with a copy button, model, runtime,
// age, cost, steps), read every second from GET /v1/sessions?usage=true. Rows are
// updated in place, so a selection or a hover survives a refresh; ages move every tick.
"use strict";

const TASK_CHARS = 90;
const SHORT_ID = 14;
const rows = new Map();  // session id -> its <li>

async function refreshSessions() {
  let page;
  try {
    page = await api("GET", "/v1/sessions?limit=100&usage=true");
    $("connection").textContent = "connected";
  } catch (e) {
    $("connection").textContent = "daemon unreachable: " + e.message;
    if (e.status === 401) return logout("the token was refused");
    return;
  }
  const list = $("sessions");
  const wanted = page.sessions.map(rowOf);
  wanted.forEach((row, i) => {
    if (list.children[i] !== row) list.insertBefore(row, list.children[i] || null);
  });
  while (list.children.length > wanted.length) {
    rows.delete(list.lastElementChild.dataset.id);
    list.lastElementChild.remove();
  }
}

function rowOf(s) {
  let row = rows.get(s.id);
  if (!row) {
    row = newRow(s.id);
    rows.set(s.id, row);
  }
  row.dataset.state = s.state;
  row.dataset.created = s.created_at;
  row.classList.toggle("selected", s.id === state.current);
  const badge = row.querySelector(".state");
  badge.className = "state " + s.state;
  setText(badge, s.state);
  setText(row.querySelector(".task"), cut(s.task));
  row.querySelector(".task").title = s.task;
  setText(row.querySelector(".model"), s.model);
  setText(row.querySelector(".runtime"), s.runtime || "local");
  setText(row.querySelector(".age"), age(s.created_at));
  setText(row.querySelector(".cost"), "$" + Number(s.cost_usd || 0).toFixed(4));
  setText(row.querySelector(".steps"), (s.iterations || 0) + (s.iterations === 1 ? " step" : " steps"));
  return row;
}

function newRow(id) {
  const row = el("li");
  row.dataset.id = id;
  const top = el("div", "row-top");
  top.append(el("span", "state"), el("span", "task"));
  const sid = el("code", "sid", id.length > SHORT_ID ? id.slice(0, SHORT_ID) + "…" : id);
  sid.title = id;
  const copy = el("button", "copy", "copy");
  copy.type = "button";
  copy.title = "copy the session id";
  copy.addEventListener("click", (event) => { event.stopPropagation(); copyId(id, copy, sid); });
  const meta = el("div", "row-meta");
  meta.append(sid, copy, el("span", "model"), el("span", "runtime"), el("span", "age"),
              el("span", "cost"), el("span", "steps"));
  meta.querySelector(".age").title = "when the session was created";
  row.append(top, meta);
  row.addEventListener("click", () => select(id));
  return row;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;  // untouched: a selection stays
}

function cut(task) {
  const line = task.split("\n").find((l) => l.trim()) || "";
  return line.length > TASK_CHARS ? line.slice(0, TASK_CHARS - 1) + "…" : line;
}

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + " s ago";
  if (s < 3600) return Math.floor(s / 60) + " min ago";
  if (s < 86400) return Math.floor(s / 3600) + " h ago";
  return Math.floor(s / 86400) + " d ago";
}

function tickAges() {
  for (const row of rows.values()) setText(row.querySelector(".age"), age(row.dataset.created));
}

async function copyId(id, button, shown) {
  try {
    await navigator.clipboard.writeText(id);
    button.textContent = "copied";
  } catch (e) {  // no clipboard (a browser's policy): select it, for Ctrl-C
    shown.textContent = id;
    getSelection().selectAllChildren(shown);
    button.textContent = "press Ctrl-C";
  }
  setTimeout(() => { button.textContent = "copy"; }, 1500);
}
