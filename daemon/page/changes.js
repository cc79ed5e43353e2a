// The session's views beside its events, and the tabs between them (the page serves a
// fixed set of public files, so both views share this one):
// - Changes: what the agent changed in the session's workspace since it started
//   (GET /v1/sessions/{id}/diff), file by file;
// - Actions: the session's audit trail (GET /v1/sessions/{id}/actions, docs/audit.md):
//   each action with who asked it, every attempt with the sandbox epoch it went to, the
//   sandbox process that ran it, its outcome and why; an action that left a checkpoint
//   has a Fork button (a new session from the workspace as that action left it).
// Each is read when its view opens, on Refresh, and after each action's outcome or change
// of state while it is open (one request at a time: a burst of events costs two). Every
// line is set as text.
"use strict";

const LETTERS = { added: "A", modified: "M", deleted: "D" };
const changes = { pending: false, again: false };

// The session's views: the tab of each has the id "tab-" + its name.
const VIEWS = { events: "events-view", changes: "changes", actions: "actions" };

function showTab(name) {
  for (const [view, id] of Object.entries(VIEWS)) {
    $("tab-" + view).classList.toggle("active", view === name);
    $(id).hidden = view !== name;
  }
  if (name === "changes") refreshChanges();
  if (name === "actions") refreshActions();
}

async function refreshChanges() {
  // one request at a time; a call meanwhile asks for one more after it (as refreshDetail)
  if (!state.current || $("changes").hidden) return;
  if (changes.pending) { changes.again = true; return; }
  changes.pending = true;
  try {
    do {
      changes.again = false;
      const id = state.current;
      $("changes-status").textContent = "comparing…";
      const diff = await api("GET", "/v1/sessions/" + encodeURIComponent(id) + "/diff");
      if (id === state.current) renderChanges(diff);
    } while (changes.again);
  } catch (e) {
    $("changes-status").textContent = e.message;
  } finally {
    changes.pending = false;
  }
}

function clearChanges() {
  $("changes-status").textContent = "";
  $("changes-notes").replaceChildren();
  $("changes-files").replaceChildren();
}

function renderChanges(diff) {
  const status = $("changes-status");
  status.dataset.available = String(diff.available);
  status.textContent = !diff.available ? "No diff: " + diff.reason
    : diff.files.length ? diff.files.length + " file(s) changed since " + diff.base
      : "No changes since " + diff.base;
  $("changes-notes").replaceChildren(...diff.notes.map((note) => el("li", null, note)));
  $("changes-files").replaceChildren(...diff.files.map(fileBlock));
}

function fileBlock(file) {
  const block = el("section", "file " + file.change);
  block.dataset.path = file.path;
  block.dataset.change = file.change;
  const head = el("h4");
  head.append(el("span", "letter", LETTERS[file.change] || "?"), el("span", "path", file.path),
              el("span", "counts muted", counts(file)));
  block.append(head);
  if (file.left_out) block.append(el("p", "muted", "not compared: " + file.left_out));
  else if (file.binary) block.append(el("p", "muted", "binary file changed"));
  else block.append(patchView(file.patch));
  return block;
}

function counts(file) {
  if (file.left_out || file.binary) return "";
  return "+" + file.added_lines + " −" + file.removed_lines;
}

function patchView(text) {
  const pre = el("pre", "patch");
  const lines = text.split("\n");
  const first = lines.findIndex((line) => line.startsWith("@@"));  // the header is above
  for (const line of lines.slice(first < 0 ? 0 : first)) {
    if (line === "") continue;
    const kind = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add"
      : line.startsWith("-") ? "del" : "ctx";
    pre.append(el("span", kind, line + "\n"));
  }
  return pre;
}

// -- the Actions view ------------------------------------------------------------------

const audit = { pending: false, again: false };

async function refreshActions() {
  if (!state.current || $("actions").hidden) return;
  if (audit.pending) { audit.again = true; return; }
  audit.pending = true;
  try {
    do {
      audit.again = false;
      const id = state.current;
      const answer = await api("GET", "/v1/sessions/" + encodeURIComponent(id) + "/actions");
      if (id === state.current) renderActions(answer.actions);
    } while (audit.again);
  } catch (e) {
    $("actions-status").textContent = e.message;
  } finally {
    audit.pending = false;
  }
}

function clearActions() {
  $("actions-status").textContent = "";
  $("actions-list").replaceChildren();
}

function renderActions(actions) {
  const open = actions.filter((a) => a.status === null).length;
  $("actions-status").textContent = actions.length + " action(s)" +
    (open ? ", " + open + " without an outcome yet" : "");
  $("actions-list").replaceChildren(...actions.map(actionBlock));
}

function actionBlock(a) {
  const item = el("li", "audit " + (a.status || "pending"));
  item.dataset.actionId = a.action_id;
  item.dataset.status = a.status || "";
  item.dataset.attempts = String(a.attempts.length);
  const head = el("div", "audit-head");
  // the summary starts with the tool's kind ("write_file a.txt"; a command: "$ ls")
  head.append(el("span", "muted", "#" + a.seq), el("span", "summary", a.summary),
              el("span", "muted", "asked by " + a.asked_by));
  item.append(head);
  const attempts = el("ol", "attempts");
  for (const t of a.attempts) attempts.append(attemptLine(t));
  if (a.attempts.length) item.append(attempts);
  item.append(outcomeLine(a));
  if (a.checkpoint && a.outcome_seq !== null) item.append(forkButton(a));
  return item;
}

function attemptLine(t) {
  const epoch = t.epoch === null ? "no sandbox" : "epoch " + t.epoch;
  const line = el("li", "attempt " + t.kind,
    t.kind + " under " + epoch + " (" + t.why + ")" +
    (t.started_it ? "; ran it: " + (t.server || "this sandbox") : ""));
  line.dataset.epoch = t.epoch === null ? "" : String(t.epoch);
  return line;
}

function outcomeLine(a) {
  if (a.status === null) return el("div", "outcome pending", "no outcome: " + a.cause);
  const facts = [];
  if (a.duration_s !== null) facts.push(a.duration_s.toFixed(2) + " s");
  if (a.output_chars !== null) facts.push(a.output_chars + " chars of output");
  if (a.checkpoint) facts.push("checkpoint " + a.checkpoint);
  return el("div", "outcome " + a.status, "#" + a.outcome_seq + " " + a.status + ": " +
    a.cause + (facts.length ? " (" + facts.join(", ") + ")" : ""));
}

// A new session from the workspace as this action left it: the fork goes up to the
// action's outcome (its seq), with the user's hint as its next message if one is given.
function forkButton(a) {
  const button = el("button", "fork", "Fork here");
  button.type = "button";
  button.dataset.atSeq = String(a.outcome_seq);
  button.addEventListener("click", () => fork(a.outcome_seq, button));
  return button;
}

async function fork(atSeq, button) {
  const hint = prompt("A message for the forked session (optional):", "");
  if (hint === null) return;  // cancelled
  const body = { at_seq: atSeq };
  if (hint.trim()) body.message = hint;
  button.disabled = true;
  $("actions-status").textContent = "forking…";
  try {
    const made = await api("POST", "/v1/sessions/" + encodeURIComponent(state.current) +
                           "/fork", body, { "Idempotency-Key": newKey() });
    await refreshSessions();
    showTab("events");
    select(made.session_id);
  } catch (e) {
    $("actions-status").textContent = "fork failed: " + e.message;
    button.disabled = false;
  }
}
