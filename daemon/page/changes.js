// The Changes view: what the agent changed in the session's workspace since it started
// (GET /v1/sessions/{id}/diff), file by file. Read when the view opens, on Refresh, and
// after each action's outcome or change of state while it is open (one request at a
// time: a burst of events costs two). Every line is set as text.
"use strict";

const LETTERS = { added: "A", modified: "M", deleted: "D" };
const changes = { pending: false, again: false };

function showTab(name) {
  const onChanges = name === "changes";
  $("tab-events").classList.toggle("active", !onChanges);
  $("tab-changes").classList.toggle("active", onChanges);
  $("events-view").hidden = onChanges;
  $("changes").hidden = !onChanges;
  if (onChanges) refreshChanges();
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
