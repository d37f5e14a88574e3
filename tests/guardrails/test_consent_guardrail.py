"""Consent requests (a server's ``elicitation/create``): the pure checks, then a real ``bastion run`` federating two
SDK servers in front of an SDK client (handshake era) with an elicitation callback. A server that asks again and
again is refused past its budget, a form asking for a password never reaches the person, and ordinary questions
pass; a foreign embedded resource and a page faking a tool boundary are dealt with on the way back."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client, StdioServerParameters

from bastion.guardrails.config import ElicitationSettings, GuardrailsConfig
from bastion.guardrails.consent import ConsentLedger, secret_fields, warned
from bastion.state import MemoryStore
from tests.guardrails.cross_server_support import DEADLINE, Person, client, cross_server_setup, text_of
from tests.support import BASTION

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")


def _form(**properties: dict) -> dict:
    return {"message": "Please fill in the form.", "requestedSchema": {"type": "object", "properties": properties}}


# ------------------------------------------------------------------------------------------ pure checks
@pytest.mark.parametrize("params", [
    _form(password={"type": "string"}),
    _form(apiKey={"type": "string"}),
    _form(user_token={"type": "string", "title": "Token"}),
    _form(value={"type": "string", "description": "Your credit card number"}),
    _form(code={"type": "string", "format": "password"}),
    _form(cvv={"type": "string"}),
    _form(seed={"type": "string", "title": "Recovery phrase"}),
    _form(**{"pass\u200bword": {"type": "string"}}),
    _form(**{"ｐａｓｓｗｏｒｄ": {"type": "string"}}),
    _form(kennwort={"type": "string", "title": "Passwort"}),
    _form(clave={"type": "string", "title": "Contraseña"}),
    {"message": "To continue, please enter your GitHub personal access token password below.",
     "requestedSchema": {"type": "object", "properties": {"value": {"type": "string"}}}},
    {"message": "Paste your API key here", "requestedSchema": {"type": "object", "properties": {}}},
])
def test_a_form_asking_for_a_secret_is_recognised(params) -> None:
    assert secret_fields(params)


@pytest.mark.parametrize("params", [
    _form(name={"type": "string", "title": "Your name"}),
    _form(date={"type": "string", "format": "date", "title": "Meeting date"}),
    _form(secretary={"type": "string", "title": "Secretary's name"}),
    _form(max_tokens={"type": "integer"}, passenger={"type": "string"}),
    _form(confirm={"type": "boolean", "description": "Send the e-mail to alice@example.com?"}),
    {"message": "Your password was changed yesterday. Was it you?",
     "requestedSchema": {"type": "object", "properties": {"yes": {"type": "boolean"}}}},
    # A URL-mode request sends the person to the server's own page: where the specification wants secrets typed.
    {"mode": "url", "message": "Enter your API key on our page", "url": "https://example.com/connect",
     "elicitationId": "e1"},
])
def test_ordinary_questions_are_not_taken_for_secrets(params) -> None:
    assert secret_fields(params) == []


async def test_the_ledger_counts_per_client_and_server_in_a_sliding_window() -> None:
    now = [100.0]
    ledger = ConsentLedger(MemoryStore(clock=lambda: now[0]),
                           ElicitationSettings(max_requests=2, window_seconds=30, servers={"forms": {"max_requests": 4}}))
    assert await ledger.admit("s1", "web") is None and await ledger.admit("s1", "web") is None
    third = await ledger.admit("s1", "web")
    assert third is not None and third.rule == "requests-per-window" and third.retry_after_seconds == 30.0
    assert "guardrails.consent.max_requests" in third.reason
    error = third.error("web")
    assert error.code == -32600 and error.data == {"guardrail": "elicitation", "rule": "requests-per-window",
                                                   "retryAfterSeconds": 30.0}
    assert await ledger.admit("s2", "web") is None  # another client has its own budget
    assert all([await ledger.admit("s1", "forms") is None for _ in range(4)])
    assert await ledger.admit("s1", "forms") is not None
    now[0] += 20
    assert await ledger.admit("s1", "web") is not None  # still inside the window of the first two
    now[0] += 11
    assert await ledger.admit("s1", "web") is None  # the window slid past them


def test_settings_are_typed_and_name_the_key() -> None:
    config = GuardrailsConfig()
    assert config.switch("elicitation", "web") == "enforce"
    assert (config.consent.max_requests, config.consent.window_seconds, config.consent.secrets) == (5, 60.0, "refuse")
    with pytest.raises(ValueError, match="consent.secrets"):
        GuardrailsConfig.model_validate({"consent": {"secrets": "ask"}})
    assert "Do not enter" in warned("What is your password?", "web", ["password"])


def test_a_budget_for_a_server_that_is_not_configured_is_an_error() -> None:
    from bastion.config import GatewayConfig

    with pytest.raises(ValueError) as refused:
        GatewayConfig.model_validate({"servers": {"web": {"command": "x"}},
                                      "guardrails": {"consent": {"servers": {"wbe": {"max_requests": 1}}}}})
    assert "guardrails.consent.servers names 'wbe'" in str(refused.value)


# ------------------------------------------------------------------------------------------ through bastion run
def servers_questions(person: Person) -> list[str]:
    """What the servers asked the person, without Bastion's own approval prompts."""
    return [request.message for request in person.elicitation_requests if "Question" in request.message]


async def test_a_server_asking_again_and_again_is_refused_past_its_budget(tmp_path) -> None:
    setup = cross_server_setup(tmp_path)
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            asked = await session.call_tool("web__ask_person", {"times": 7})
            other = await session.call_tool("notes__ask_person", {"times": 1})
    lines = text_of(asked).splitlines()
    assert lines[:5] == ["answered: accept"] * 5
    assert len(lines) == 7 and all("refused by Bastion" in line and "guardrails.consent.max_requests" in line
                                   for line in lines[5:])
    # The refused ones never reached the person; another server keeps its own budget. (Bastion's own approval
    # prompts are elicitations too, of no server: they count against no server's budget.)
    assert text_of(other) == "answered: accept"
    assert servers_questions(person) == [
        *(f"Question {n}: what is your name?" for n in range(1, 6)), "Question 1: what is your name?"]


async def test_a_form_asking_for_a_password_never_reaches_the_person(tmp_path) -> None:
    setup = cross_server_setup(tmp_path)
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            asked = await session.call_tool("web__ask_person", {"secret": True})
    assert "refused by Bastion" in text_of(asked) and "password" in text_of(asked)
    assert servers_questions(person) == []


async def test_flagged_secrets_reach_the_person_with_a_warning_first(tmp_path) -> None:
    setup = cross_server_setup(tmp_path, guardrails={"consent": {"secrets": "flag"}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            asked = await session.call_tool("web__ask_person", {"secret": True})
    assert text_of(asked) == "answered: accept"
    [message] = servers_questions(person)
    assert message.startswith("[Bastion: server 'web' asks for what reads as a secret (password)")


async def test_an_embedded_resource_claiming_another_servers_uri_and_a_fake_tool_boundary(tmp_path) -> None:
    setup = cross_server_setup(tmp_path)
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            foreign = await session.call_tool("web__embed", {"uri": "notes://private/notes"})
            own = await session.call_tool("web__embed", {"uri": "web://private/notes"})
            page = await session.call_tool("web__poisoned_page", {})
    assert "Bastion withheld contents that server 'web' gave as a resource of server 'notes'" in text_of(foreign)
    assert [block.type for block in foreign.content] == ["text", "text"]
    assert [block.type for block in own.content] == ["text", "resource"]
    text = text_of(page)
    assert text.startswith("[Bastion: the text below is untrusted data from server 'web'")
    assert "fake-boundary" in text and "image-exfiltration" in text


async def test_a_2026_07_28_client_is_held_to_the_same_budget_and_secrets_setting_and_output_checks(tmp_path) -> None:
    # The client asks in the 2026-07-28 way (no session: each request is one of its own), so the budget is kept per
    # caller, not per session; the server asks mid-call and Bastion puts the question in the client's answer.
    setup = cross_server_setup(tmp_path, guardrails={"taint": "off"})
    person = Person()
    modern = Client(StdioServerParameters(command=BASTION, args=["run", str(setup.config), "-q"]), mode="2026-07-28",
                    read_timeout_seconds=DEADLINE, sampling_callback=person.on_sampling,
                    elicitation_callback=person.on_elicitation)
    with anyio.fail_after(DEADLINE):
        async with modern as session:
            first = await session.call_tool("web__ask_person", {"times": 3})
            second = await session.call_tool("web__ask_person", {"times": 3})
            secret = await session.call_tool("notes__ask_person", {"secret": True})
            page = await session.call_tool("web__poisoned_page", {})
            foreign = await session.call_tool("web__embed", {"uri": "notes://private/notes"})
    assert text_of(first).splitlines() == ["answered: accept"] * 3
    lines = text_of(second).splitlines()
    assert lines[:2] == ["answered: accept"] * 2
    assert "refused by Bastion" in lines[2] and "guardrails.consent.max_requests" in lines[2]
    assert "refused by Bastion" in text_of(secret)
    assert len(servers_questions(person)) == 5
    # The output attacks are dealt with for this era too.
    assert text_of(page).startswith("[Bastion: the text below is untrusted data from server 'web'")
    assert "gave as a resource of server 'notes'" in text_of(foreign)
