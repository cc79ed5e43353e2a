"""The daemon's web page, end to end in headless Chromium (Debian's, through Playwright):
start a session from the form and watch it finish, approve and reject actions, pause and
resume one. Screenshots are kept in the test's folder and in test-artifacts/.

Without /usr/bin/chromium the test is skipped, saying why; in CI (``CI`` set) or with
``TROUPER_REQUIRE_BROWSER=1`` it fails instead (``scripts/browser`` installs it).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from trouper.testing.daemon import running_daemon

pytestmark = pytest.mark.slow  # starts a daemon process and a browser

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
FINISH = {"tool": "finish", "args": {"message": "done"}}
LONG_S = 60_000  # ms: a generous bound on a busy machine


def browser_required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("TROUPER_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="module")
def browser():
    missing = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "the playwright package is not installed"
    if missing is None and not os.access(CHROMIUM, os.X_OK):
        missing = f"{CHROMIUM} is missing (bash scripts/browser installs it)"
    if missing is not None:
        if browser_required():
            pytest.fail(f"the browser test must run here: {missing}")
        pytest.skip(missing)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with running_daemon(tmp_path_factory.mktemp("phome")) as d:
        yield d


@pytest.fixture
def page(browser, daemon, tmp_path, request):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{daemon.url}/#token={daemon.token}")
    yield page
    shot = tmp_path / f"{request.node.name}.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / shot.name)
    context.close()
    assert errors == []


def start_from_the_form(page, llm: dict, task: str, confirm: str = "never") -> str:
    page.fill("#new-task", task)
    page.fill("#new-model", llm["model"])
    page.fill("#new-base-url", llm["base_url"])
    page.fill("#new-api-key", llm["api_key"])
    page.select_option("#new-confirm", confirm)
    page.click("#new-submit")
    page.wait_for_function(
        "task => [...document.querySelectorAll('#sessions li')].some("
        "li => li.querySelector('.task').textContent === task && li.classList.contains"
        "('selected'))", arg=task, timeout=LONG_S)
    return page.text_content("#session-id") or ""


def test_start_a_session_and_watch_it_finish(page, daemon, scripted):
    from playwright.sync_api import expect

    assert "token" not in page.url  # the fragment is taken off at once
    _, llm = scripted([{"tool": "run", "args": {"command": "echo hello from the page"}},
                       {"tool": "write_file", "args": {"path": "a.txt", "content": "A"}},
                       FINISH])
    sid = start_from_the_form(page, llm, "greet from the browser")
    expect(page.locator("#state")).to_have_text("finished", timeout=LONG_S)
    outcomes = page.locator("#events li.action .outcome")
    expect(outcomes).to_have_count(3, timeout=LONG_S)
    expect(outcomes.first).to_contain_text("hello from the page")
    expect(page.locator("#sessions li.selected .state")).to_have_text("finished",
                                                                       timeout=LONG_S)
    assert daemon.client().session(sid).state.value == "finished"
    expect(page.locator("#events li.msg-user")).to_have_text("greet from the browser")


def test_approve_and_reject_from_the_page(page, daemon, scripted, tmp_path):
    from playwright.sync_api import expect

    _, llm = scripted([{"tool": "run", "args": {"command": "echo approved"}},
                       {"tool": "run", "args": {"command": "echo never runs"}},
                       FINISH])
    sid = start_from_the_form(page, llm, "two actions to answer", confirm="always")
    pending = page.locator("#pending")
    expect(pending).to_be_visible(timeout=LONG_S)
    expect(page.locator("#pending-action")).to_have_text("$ echo approved")
    expect(page.locator("#state")).to_have_text("awaiting_user_confirmation")
    page.click("#approve")
    expect(page.locator("#pending-action")).to_have_text("$ echo never runs",
                                                         timeout=LONG_S)
    page.fill("#reject-reason", "not this one")
    page.click("#reject")
    expect(page.locator("#state")).to_have_text("finished", timeout=LONG_S)
    expect(pending).to_be_hidden()
    # the badge comes from GET /v1/sessions/ID, the events from the WebSocket: the last
    # outcomes may arrive a moment after "finished" shows
    expect(page.locator("#events .outcome")).to_have_count(3, timeout=LONG_S)
    statuses = page.locator("#events .outcome").evaluate_all(
        "nodes => nodes.map(n => n.dataset.status)")
    assert statuses == ["ok", "rejected", "ok"]
    # the rejected action is listed once, its rejection as its outcome: not also as a
    # line of its own (the answer), nor in the state changes (waiting for it, rejected)
    expect(page.locator("#events > li", has_text="not this one")).to_have_count(1)
    expect(page.locator("#events > li", has_text="echo never runs")).to_have_count(1)
    rejected = page.locator("#events li.action", has_text="echo never runs")
    expect(rejected).to_have_count(1)
    expect(rejected.locator(".outcome")).to_have_text(
        "rejected: The user rejected this action: not this one")
    expect(page.locator("#events li.action", has_text="echo approved")).to_contain_text(
        "approved by you")
    assert page.locator("#approve").is_disabled() and page.locator("#reject").is_disabled()
    events = list(daemon.client().session(sid).events())
    assert [e.approved for e in events if e.kind == "confirmation"] == [True, False]


def test_pause_and_resume_from_the_page(page, daemon, scripted):
    from playwright.sync_api import expect

    _, llm = scripted([{"tool": "run", "args": {"command": f"echo {i}"}, "delay_s": 0.3}
                       for i in range(12)] + [FINISH])
    sid = start_from_the_form(page, llm, "slow and steady")
    expect(page.locator("#events li.action").first).to_be_visible(timeout=LONG_S)
    expect(page.locator("#state")).to_have_text("running")
    expect(page.locator("#pause")).to_be_enabled()  # the buttons follow the state
    expect(page.locator("#resume")).to_be_disabled()
    page.click("#pause")
    expect(page.locator("#state")).to_have_text("paused", timeout=LONG_S)
    expect(page.locator("#pause")).to_be_disabled()
    expect(page.locator("#resume")).to_be_enabled()
    remote = daemon.client().session(sid)
    assert remote.state.value == "paused"
    shown = page.locator("#events li.action").count()
    page.click("#resume")
    expect(page.locator("#state")).to_have_text(re.compile("running|finished"),
                                                timeout=LONG_S)
    expect(page.locator("#state")).to_have_text("finished", timeout=LONG_S)
    page.wait_for_function(  # the events come over the WebSocket, after or before the badge
        "n => document.querySelectorAll('#events li.action').length > n", arg=shown,
        timeout=LONG_S)
    assert remote.state.value == "finished"
    page.fill("#message", "thanks")
    page.click("#send")
    expect(page.locator("#events li.msg-user", has_text="thanks")).to_have_count(
        1, timeout=LONG_S)


def test_the_page_asks_for_a_token_and_refuses_a_wrong_one(browser, daemon):
    from playwright.sync_api import expect

    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(daemon.url + "/")
        expect(page.locator("#login")).to_be_visible()
        page.fill("#token-input", "not-the-token")
        page.click("#token-form button")
        expect(page.locator("#login-error")).to_have_text("the token was refused",
                                                          timeout=LONG_S)
        page.fill("#token-input", daemon.token)
        page.click("#token-form button")
        expect(page.locator("#app")).to_be_visible()
        expect(page.locator("#connection")).to_have_text("connected", timeout=LONG_S)
    finally:
        context.close()


def test_retries_and_a_rate_limit_countdown_show_and_resume_lifts_it(page, daemon, scripted):
    from playwright.sync_api import expect

    _, llm = scripted([{"tool": "run", "args": {"command": "echo after the limit"},
                        "fail": [{"status": 429, "retry_after": 0.2},
                                 {"status": 429, "retry_after": 600}]},
                       FINISH])
    session = daemon.client().start_session("limited", llm={**llm, "num_retries": 1})
    item = page.locator("#sessions li", has_text="limited")
    expect(item).to_be_visible(timeout=LONG_S)
    item.click()
    expect(page.locator("#state")).to_have_text("rate_limited", timeout=LONG_S)
    expect(page.locator("#events li.status", has_text="model call failed (rate_limit)")
           ).to_have_count(1)
    expect(page.locator("#countdown")).to_have_text(re.compile(r"resumes in (59\d|600) s"))
    page.click("#resume")
    expect(page.locator("#state")).to_have_text("finished", timeout=LONG_S)
    expect(page.locator("#countdown")).to_have_text("")
    assert session.state.value == "finished"


def test_a_command_whose_answer_a_dropped_connection_lost_is_sent_again_and_done_once(
        page, daemon, scripted):
    """The first message reaches the daemon and its answer is cut (the connection reset);
    the page sends it again under the same Idempotency-Key and the daemon does it once."""
    from playwright.sync_api import expect

    _, llm = scripted([{"say": "What next?"}, {"say": "And?"}])
    sid = start_from_the_form(page, llm, "say something")
    expect(page.locator("#state")).to_have_text("awaiting_user_input", timeout=LONG_S)
    cut: list[str] = []

    def answer_lost(route) -> None:
        if cut:
            route.continue_()
            return
        route.fetch()  # the daemon carries it out; its answer never reaches the page
        cut.append(route.request.headers.get("idempotency-key", ""))
        route.abort("connectionreset")

    page.route("**/v1/sessions/*/messages", answer_lost)
    page.fill("#message", "go on")
    # the event may be on the page before the cut (the stream is quicker than the POST's
    # answer): what the test waits for is the answer to the message sent again
    with page.expect_response(lambda r: r.url.endswith("/messages"),
                              timeout=LONG_S) as again:
        page.click("#send")
    assert again.value.ok and again.value.request.headers["idempotency-key"] == cut[0] != ""
    expect(page.locator("#events li.msg-user", has_text="go on")).to_have_count(
        1, timeout=LONG_S)
    expect(page.locator("#command-error")).to_have_text("")
    assert len(cut) == 1
    events = daemon.http().get(f"/v1/sessions/{sid}/events").json()["events"]
    said = [e["text"] for e in events if e["kind"] == "message" and e["source"] == "user"]
    assert said == ["say something", "go on"]


def test_the_list_shows_each_session_s_id_task_state_model_runtime_age_cost_and_steps(
        page, daemon, scripted, tmp_path):
    from playwright.sync_api import expect

    _, llm = scripted([{"tool": "run", "args": {"command": "echo listed"}}, FINISH])
    task = "a task for the list " + "that goes on " * 12
    session = daemon.client().start_session(task, llm=llm, workspace=tmp_path / "ws")
    assert session.wait(timeout=60).value == "finished"
    info = session.info()
    row = page.locator(f"#sessions li[data-id='{session.id}']")
    expect(row.locator(".state")).to_have_text("finished", timeout=LONG_S)
    expect(row.locator(".sid")).to_have_text(session.id)
    expect(row.locator(".task")).to_have_text(re.compile(r"^a task for the list .*…$"))
    assert row.locator(".task").get_attribute("title") == task
    expect(row.locator(".model")).to_have_text(llm["model"])
    expect(row.locator(".runtime")).to_have_text("local")
    expect(row.locator(".cost")).to_have_text(f"${info.cost_usd:.4f}")
    expect(row.locator(".steps")).to_have_text(f"{info.iterations} steps")
    assert info.iterations == 2
    first = row.locator(".age").text_content()
    assert re.fullmatch(r"\d+ s ago", first or ""), first
    page.wait_for_function(  # the age moves on by itself, without a new session event
        "([id, age]) => document.querySelector(`#sessions li[data-id='${id}'] .age`)"
        ".textContent !== age", arg=[session.id, first], timeout=LONG_S)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    row.locator("button.copy").click()
    expect(row.locator("button.copy")).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == session.id
    expect(page.locator("#session")).to_be_hidden()  # copying did not open the session


def test_buttons_that_cannot_apply_to_a_finished_session_are_disabled(page, daemon, scripted):
    from playwright.sync_api import expect

    _, llm = scripted([FINISH])
    session = daemon.client().start_session("finish at once", llm=llm)
    assert session.wait(timeout=60).value == "finished"
    page.locator(f"#sessions li[data-id='{session.id}']").click()
    expect(page.locator("#state")).to_have_text("finished", timeout=LONG_S)
    for name in ("pause", "resume", "approve", "reject"):
        expect(page.locator(f"#{name}")).to_be_disabled()
    expect(page.locator("#stop")).to_be_enabled()  # a finished session may still be stopped
    expect(page.locator("#send")).to_be_enabled()  # and given more work


def test_the_changes_view_shows_what_the_agent_wrote(page, daemon, scripted, tmp_path):
    from playwright.sync_api import expect

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("one\ntwo\n")
    (workspace / "kept.txt").write_text("untouched\n")
    _, llm = scripted([
        {"tool": "write_file", "args": {"path": "hello.py", "content": "print('hi')\n"}},
        {"tool": "edit_file", "args": {"path": "notes.txt", "old": "two", "new": "TWO"}},
        FINISH])
    session = daemon.client().start_session("write hello.py", llm=llm, workspace=workspace)
    assert session.wait(timeout=60).value == "finished"
    page.locator(f"#sessions li[data-id='{session.id}']").click()
    page.click("#tab-changes")
    files = page.locator("#changes-files .file")
    expect(files).to_have_count(2, timeout=LONG_S)
    assert files.evaluate_all("nodes => nodes.map(n => [n.dataset.path, n.dataset.change])"
                              ) == [["hello.py", "added"], ["notes.txt", "modified"]]
    expect(files.first.locator(".patch .add")).to_have_text("+print('hi')\n")
    expect(files.nth(1).locator(".patch .del")).to_have_text("-two\n")
    expect(files.nth(1).locator(".patch .add")).to_have_text("+TWO\n")
    expect(page.locator("#changes-status")).to_contain_text("2 file(s) changed since")
    expect(page.locator("#changes")).not_to_contain_text("kept.txt")
    expect(page.locator("#events-view")).to_be_hidden()


def test_loading_the_page_makes_no_failed_request_and_logs_no_error(browser, daemon,
                                                                     scripted):
    """Every request the page makes carries the token: none is answered 401 (the browser's
    own /favicon.ico was), nor fails otherwise, while the list refreshes, a session is
    opened (its view, its stream, its changes) and read again."""
    _, llm = scripted([FINISH])
    session = daemon.client().start_session("load quietly", llm=llm)
    assert session.wait(timeout=60).value == "finished"
    context = browser.new_context()
    problems: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text} "
                                                     f"{m.location.get('url')}")
                if m.type in ("error", "warning") else None)
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}")
                if r.status >= 400 else None)
        page.on("requestfailed", lambda r: problems.append(f"failed {r.url}: {r.failure}"))
        page.on("pageerror", lambda exc: problems.append(f"page error {exc}"))
        page.goto(f"{daemon.url}/#token={daemon.token}")
        page.locator(f"#sessions li[data-id='{session.id}']").click()
        page.click("#tab-changes")
        page.wait_for_selector("#changes-status[data-available]", timeout=LONG_S)
        for _ in range(2):  # and the list read twice more, as it is every second
            page.wait_for_event("response", lambda r: "/v1/sessions?" in r.url,
                                timeout=LONG_S)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "page-load.png"), full_page=True)
    finally:
        context.close()
    assert problems == []


def test_the_changes_view_follows_the_session_while_it_is_open(page, daemon, scripted,
                                                               tmp_path):
    from playwright.sync_api import expect

    _, llm = scripted([
        {"tool": "write_file", "args": {"path": "later.txt", "content": "written\n"}},
        FINISH])
    session = daemon.client().start_session("write later", llm=llm,
                                            workspace=tmp_path / "ws", confirm="always")
    assert session.wait(timeout=60).value == "awaiting_user_confirmation"
    page.locator(f"#sessions li[data-id='{session.id}']").click()
    page.click("#tab-changes")
    expect(page.locator("#changes-status")).to_contain_text("No changes since",
                                                            timeout=LONG_S)
    page.click("#approve")  # the action runs; the open view reads the diff again
    expect(page.locator("#changes-files .file[data-path='later.txt']")).to_be_visible(
        timeout=LONG_S)
    expect(page.locator("#changes-status")).to_contain_text("1 file(s) changed since")


def test_a_budget_that_ran_out_is_raised_from_the_page(page, daemon, scripted):
    from playwright.sync_api import expect

    steps = [{"tool": "run", "args": {"command": f"echo {i}"}} for i in range(4)]
    _, llm = scripted([*steps, FINISH])
    sid = daemon.http().post("/v1/sessions", json={
        "task": "count on a budget", "llm": llm, "max_iterations": 2,
        "on_budget": "ask"}).json()["id"]
    assert daemon.client().session(sid).wait(timeout=LONG_S).value == "paused"
    page.locator("#sessions li", has_text="count on a budget").click()
    expect(page.locator("#state")).to_have_text("paused", timeout=LONG_S)
    expect(page.locator("#reason")).to_contain_text("reached max_iterations (2 model calls)")
    expect(page.locator("#budget")).to_be_visible()
    expect(page.locator("#budget-iterations")).to_have_value("2")
    page.fill("#budget-iterations", "10")
    page.click("#budget-raise")
    expect(page.locator("#state")).to_have_text("finished", timeout=LONG_S)
    expect(page.locator("#budget")).to_be_hidden()
    assert daemon.client().session(sid).state.value == "finished"
