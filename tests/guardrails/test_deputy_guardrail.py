"""Confused-deputy protection: a server reads through Bastion only what it owns. Its pure parts, then a real
``bastion run`` with two SDK servers: a resource link to the other server's resource is withheld from a result
(its own links pass), a sampling request that carries the other server's resource is refused, and an allowed
pair passes."""

from __future__ import annotations

import anyio
import pytest
from mcp.types import ResourceLink, TextContent

from bastion.config import GatewayConfig
from bastion.guardrails.config import CrossServerSettings
from bastion.guardrails.deputy import foreign_owner, result_links, sampling_references
from tests.guardrails.cross_server_support import DEADLINE, LLM_ANSWER, Person, client, cross_server_setup, text_of

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

OWNERS = {"notes://private/notes": "notes", "web://private/notes": "web"}


def test_foreign_owner_and_allowed_pairs() -> None:
    settings = CrossServerSettings(allow={"web": ["notes"], "any": ["*"]})
    nobody = CrossServerSettings().allows
    assert foreign_owner("notes://private/notes", "web", OWNERS.get, nobody) == "notes"
    assert foreign_owner("web://private/notes", "web", OWNERS.get, nobody) is None  # its own
    assert foreign_owner("https://example.com/", "web", OWNERS.get, nobody) is None  # nobody's: nothing to protect
    assert foreign_owner("notes://private/notes", "web", OWNERS.get, settings.allows) is None
    assert foreign_owner("notes://private/notes", "any", OWNERS.get, settings.allows) is None
    assert foreign_owner("web://private/notes", "notes", OWNERS.get, settings.allows) == "web"  # not the other way


def test_a_pair_naming_a_server_that_is_not_configured_is_an_error() -> None:
    servers = {"web": {"command": "x"}, "notes": {"command": "x"}}
    GatewayConfig.model_validate({"servers": servers, "guardrails": {"cross_server": {"allow": {"web": ["notes", "*"]}}}})
    with pytest.raises(ValueError) as refused:
        GatewayConfig.model_validate({"servers": servers, "guardrails": {"cross_server": {"allow": {"web": ["ntoes"]}}}})
    assert "guardrails.cross_server.allow names 'ntoes'" in str(refused.value)


def test_links_found_in_tool_results_and_prompt_messages() -> None:
    link = {"type": "resource_link", "uri": "notes://private/notes", "name": "n"}
    tool = {"content": [{"type": "text", "text": "see"}, dict(link)]}
    assert [(holder is tool["content"], key) for holder, key in result_links("tools/call", tool)] == [(True, 1)]
    prompt = {"messages": [{"role": "user", "content": dict(link)}, {"role": "user", "content": {"type": "text"}}]}
    assert [(holder is prompt["messages"][0], key) for holder, key in result_links("prompts/get", prompt)] == \
        [(True, "content")]


def test_sampling_references_include_tool_results_and_embedded_resources() -> None:
    params = {"messages": [
        {"role": "user", "content": {"type": "text", "text": "hi"}},
        {"role": "user", "content": [{"type": "resource", "resource": {"uri": "a://1", "text": "x"}}]},
        {"role": "user", "content": {"type": "tool_result", "toolUseId": "1",
                                     "content": [{"type": "resource_link", "uri": "b://2", "name": "b"}]}},
    ]}
    assert list(sampling_references(params)) == ["a://1", "b://2"]


async def test_a_link_to_another_servers_resource_is_withheld_and_its_own_passes(tmp_path) -> None:
    setup = cross_server_setup(tmp_path)
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            foreign = await session.call_tool("web__link_to", {"uri": "notes://private/notes"})
            own = await session.call_tool("web__link_to", {"uri": "web://private/notes"})
            nobodys = await session.call_tool("web__link_to", {"uri": "https://example.com/page"})
            sampled = await session.call_tool("web__ask_about", {"uri": "notes://private/notes"})
            sampled_own = await session.call_tool("web__ask_about", {"uri": "web://private/notes"})
    assert not any(isinstance(block, ResourceLink) for block in foreign.content)
    assert "withheld a link to a resource of server 'notes'" in text_of(foreign)
    assert "notes://private/notes" not in text_of(foreign)
    [link] = [block for block in own.content if isinstance(block, ResourceLink)]
    assert str(link.uri) == "web://private/notes"
    assert any(isinstance(block, ResourceLink) for block in nobodys.content)
    assert text_of(sampled).startswith("refused:") and "carries a resource of server 'notes'" in text_of(sampled)
    assert text_of(sampled_own) == f"answered: {LLM_ANSWER}"
    assert len(person.sampling_requests) == 1  # the refused request never reached the client
    assert isinstance(foreign.content[0], TextContent) and foreign.content[0].text == "See the linked resource."


async def test_an_allowed_pair_passes(tmp_path) -> None:
    setup = cross_server_setup(tmp_path, guardrails={"cross_server": {"allow": {"web": ["notes"]}}})
    person = Person()
    with anyio.fail_after(DEADLINE):
        async with client(setup, person) as session:
            linked = await session.call_tool("web__link_to", {"uri": "notes://private/notes"})
            sampled = await session.call_tool("web__ask_about", {"uri": "notes://private/notes"})
            back = await session.call_tool("notes__link_to", {"uri": "web://private/notes"})
    [link] = [block for block in linked.content if isinstance(block, ResourceLink)]
    assert str(link.uri) == "notes://private/notes"
    assert text_of(sampled) == f"answered: {LLM_ANSWER}"
    assert "withheld a link to a resource of server 'web'" in text_of(back)
