"""One face for every client: ``Trouper``, a daemon's ``RemoteTrouper`` and the CLI's
``StoreReader`` implement ``TrouperClient``; ``Session`` and ``RemoteSession``
``SessionHandle``: every member, with the same signature and return type, read by
``inspect`` (not only ``isinstance``). And the typed records both return: what the
daemon sends parses back into the very values the embedded side builds.

No process is started here (tests/test_one_face.py runs both for real).
"""

from __future__ import annotations

import inspect
import sys
import typing
from datetime import UTC, datetime

import pytest

from trouper.client.daemon import RemoteSession, RemoteTrouper, _plain
from trouper.client.embedded import Trouper
from trouper.client.info import SessionInfo, SessionSummary, state_filter
from trouper.client.protocol import SessionHandle, TrouperClient
from trouper.client.session import Session
from trouper.client.store_reader import StoreReader
from trouper.config.models import ConfirmationPolicy, LLMConfig, LocalRuntime, RuntimeConfig
from trouper.core.fold import SessionView
from trouper.exceptions import ConfigError, InvalidRequest, UnknownSession
from trouper.messages.events import ActionEvent, AgentState, Event, StateChanged
from trouper.store import SessionRecord
from trouper.workspace_diff import WorkspaceDiff

NAMES = {  # what the modules import only for type checking, to resolve their hints
    "ActionEvent": ActionEvent, "AgentState": AgentState, "Event": Event,
    "LLMConfig": LLMConfig, "RuntimeConfig": RuntimeConfig, "SessionView": SessionView,
    "SessionInfo": SessionInfo, "SessionSummary": SessionSummary, "Session": Session,
    "RemoteSession": RemoteSession, "SessionHandle": SessionHandle, "Trouper": Trouper,
    "RemoteTrouper": RemoteTrouper, "StoreReader": StoreReader, "Self": typing.Self,
    "SessionRecord": SessionRecord, "TrouperClient": TrouperClient,
    "WorkspaceDiff": WorkspaceDiff,
}
HANDLES = {SessionHandle: (Session, RemoteSession)}
"""A protocol a member returns, and the classes that may stand for it (checked too)."""
INSTANCE_ATTRIBUTES = {"id"}
"""Properties of a protocol an implementation may keep as a plain attribute of each
instance (``test_both_handles_have_an_id`` checks them there)."""
EXTRAS = {(Trouper, "close"): ["stop_sandboxes"]}
"""Parameters an implementation adds to a member, each with a default (so a call made
through the protocol is a call it takes): documented in docs/api.md."""


def members(protocol: type) -> dict[str, object]:
    """The methods and properties a protocol names (``__enter__``/``__exit__`` too)."""
    return {name: value for name, value in vars(protocol).items()
            if (not name.startswith("_") or name in ("__enter__", "__exit__"))
            and (inspect.isfunction(value) or isinstance(value, property))}


def shape(owner: type, name: str) -> tuple[str, list[tuple], object]:
    """A member's kind, its parameters (name, kind, default, resolved annotation) after
    ``self``, and its resolved return annotation."""
    member = inspect.getattr_static(owner, name)
    function = member.fget if isinstance(member, property) else member
    module = vars(sys.modules[function.__module__])
    hints = typing.get_type_hints(function, globalns=module, localns=NAMES)
    parameters = list(inspect.signature(function).parameters.values())[1:]
    listed = [(p.name, p.kind, p.default, hints.get(p.name)) for p in parameters]
    return ("property" if isinstance(member, property) else "method"), listed, \
        hints.get("return")


def differences(protocol: type, implementation: type) -> list[str]:
    """Where ``implementation`` does not offer ``protocol``'s members as it names them."""
    found = []
    for name in sorted(members(protocol).keys() - INSTANCE_ATTRIBUTES):
        wanted_kind, wanted, wanted_return = shape(protocol, name)
        try:
            kind, given, given_return = shape(implementation, name)
        except AttributeError:
            found.append(f"{name}: missing")
            continue
        extra = EXTRAS.get((implementation, name), [])
        added = [p for p in given if p[0] in extra]
        if kind != wanted_kind:
            found.append(f"{name}: a {kind}, not a {wanted_kind}")
        if [p for p in given if p[0] not in extra] != wanted:
            found.append(f"{name}: parameters {given} instead of {wanted}")
        if any(p[2] is inspect.Parameter.empty for p in added):
            found.append(f"{name}: an added parameter without a default")
        if not _returns_as(wanted_return, given_return, implementation):
            found.append(f"{name}: returns {given_return} instead of {wanted_return}")
    return found


def _returns_as(wanted: object, given: object, implementation: type) -> bool:
    if wanted is object or wanted == given:
        return True
    if wanted is typing.Self:  # the class itself (a subclass inherits its base's)
        return isinstance(given, type) and issubclass(implementation, given)
    return given in HANDLES.get(wanted, ())  # type: ignore[call-overload]


@pytest.mark.parametrize("implementation", [Trouper, RemoteTrouper, StoreReader])
def test_every_client_offers_the_whole_protocol_as_it_names_it(implementation):
    assert differences(TrouperClient, implementation) == []
    assert issubclass(implementation, TrouperClient)


@pytest.mark.parametrize("implementation", [Session, RemoteSession])
def test_every_session_handle_offers_the_whole_protocol_as_it_names_it(implementation):
    assert differences(SessionHandle, implementation) == []


def test_both_handles_have_an_id():
    remote = RemoteSession(RemoteTrouper("http://127.0.0.1:9", "t"), "s-1")
    embedded = Session(object(), "s-1")  # type: ignore[arg-type]
    assert remote.id == embedded.id == "s-1"


def test_the_check_sees_a_signature_that_differs():
    """The checker itself, on classes that each get one thing wrong."""

    class OtherDefault(RemoteSession):
        def approve(self, action_id: str = "x") -> int:
            return 0

    class OtherReturn(RemoteSession):
        def info(self) -> dict:  # type: ignore[override]
            return {}

    class NotAProperty(RemoteSession):
        def fault(self) -> str | None:  # type: ignore[override]
            return None

    class Dicts(RemoteTrouper):
        def sessions(self, state: AgentState | str | None = None, *,  # type: ignore[override]
                     replaced: bool = False) -> list[dict]:
            return []

    assert [d.split(":")[0] for d in differences(SessionHandle, OtherDefault)] == ["approve"]
    assert [d.split(":")[0] for d in differences(SessionHandle, OtherReturn)] == ["info"]
    assert [d.split(":")[0] for d in differences(SessionHandle, NotAProperty)] == ["fault"]
    assert [d.split(":")[0] for d in differences(TrouperClient, Dicts)] == ["sessions"]


# -- the typed records ---------------------------------------------------------------------


def a_record(config_extra: dict | None = None) -> SessionRecord:
    from trouper.config.models import SessionConfig

    config = SessionConfig(task="make hello.txt", workspace="/tmp/ws",
                           llm=LLMConfig(model="hosted_vllm/x", base_url="http://127.0.0.1:1"),
                           **(config_extra or {}))
    moment = datetime(2025, 5, 1, 12, 0, 0, tzinfo=UTC)
    return SessionRecord(session_id="s-1", config=config, created_at=moment,
                         updated_at=moment, last_seq=3,
                         state=AgentState.AWAITING_USER_CONFIRMATION,
                         state_reason="waiting for approval of run: ls")


def waiting_view() -> SessionView:
    from trouper.messages.events import EVENT_ADAPTER

    action = EVENT_ADAPTER.validate_python({
        "kind": "action", "seq": 2, "action_id": "a-1", "turn_id": "t-1",
        "tool_call_id": "c-1", "tool": "run",
        "arguments": '{"command": "ls"}', "action": {"kind": "run", "command": "ls"}})
    return SessionView.of([
        StateChanged(seq=1, state=AgentState.RUNNING), action,
        StateChanged(seq=3, state=AgentState.AWAITING_USER_CONFIRMATION,
                     reason="waiting for approval of run: ls")])


def test_a_summary_reads_back_from_the_json_the_daemon_sends():
    summary = SessionSummary.of_record(a_record())
    sent = summary.to_json()
    assert sent["created_at"] == "2025-05-01T12:00:00+00:00"  # the API's form, not "Z"
    assert sent["state"] == "awaiting_user_confirmation" and sent["id"] == "s-1"
    assert SessionSummary.model_validate(sent) == summary
    assert SessionSummary.model_validate({**sent, "added_later": 1}) == summary


def test_info_reads_back_from_the_json_the_daemon_sends():
    info = SessionInfo.of(a_record(), waiting_view(), fault=None)
    sent = info.to_json()
    assert "api_key" not in sent["config"]["llm"]
    assert sent["awaiting_confirmation"]["action_id"] == "a-1"
    back = SessionInfo.model_validate(sent)
    assert back == info
    assert isinstance(back.awaiting_confirmation, ActionEvent)
    assert back.state == AgentState.AWAITING_USER_CONFIRMATION and back.settled


def test_info_during_a_storage_fault_reads_error_and_not_settled():
    info = SessionInfo.of(a_record(), waiting_view(), fault="the disk is full")
    assert (info.state, info.reason, info.fault, info.settled) == (
        AgentState.ERROR, "the disk is full", "the disk is full", False)


def test_a_state_filter_takes_a_state_or_its_name_and_refuses_others():
    assert state_filter("paused") == state_filter(AgentState.PAUSED) == AgentState.PAUSED
    assert state_filter(None) is None
    with pytest.raises(ConfigError) as refused:
        state_filter("sleeping")
    assert refused.value.field == "state" and "paused" in str(refused.value)


def test_a_daemons_client_sends_config_models_as_json_with_their_secrets():
    """``start_session`` takes the same arguments on both sides: models included."""
    import json

    llm = LLMConfig(model="openai/x", api_key="sk-123")
    body = {"llm": _plain(llm), "runtime": _plain(LocalRuntime(network=False)),
            **_plain({"confirm": ConfirmationPolicy(mode="tools", tools=["run"])})}
    sent = json.loads(json.dumps(body))
    assert sent["llm"] == {"model": "openai/x", "api_key": "sk-123", **{
        k: v for k, v in sent["llm"].items() if k not in ("model", "api_key")}}
    assert sent["runtime"]["network"] is False and sent["runtime"]["kind"] == "local"
    assert sent["confirm"]["tools"] == ["run"]


# -- the store reader ---------------------------------------------------------------------


def test_the_store_reader_lists_and_reads_but_drives_nothing(tmp_path):
    from trouper.home.paths import Home
    from trouper.store import open_store

    home = Home.at(tmp_path / "home")
    store = open_store(home)
    record = a_record()
    store.create_session("s-1", record.config)
    store.close()
    with StoreReader(home) as reader:
        assert [s.id for s in reader.sessions()] == ["s-1"]
        assert [s.id for s in reader.sessions(state="loading")] == ["s-1"]
        assert reader.sessions(state=AgentState.FINISHED) == []
        session = reader.session("s-1")
        assert session.info().state == AgentState.LOADING and session.fault is None
        with pytest.raises(InvalidRequest, match="reads the store"):
            session.pause()
        with pytest.raises(InvalidRequest, match="reads the store"):
            reader.start_session("t", llm={"model": "hosted_vllm/x"})
        with pytest.raises(UnknownSession):
            reader.session("s-none")
