"""Cedar authorization: allow, deny, approval, schema validation at load, the default policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.model import Identity, ToolEntry
from bastion.policy.cedar_engine import (
    CedarAuthorizer,
    PolicyLoadError,
    SessionFacts,
    Target,
    ToolFacts,
    authorize_server_request,
    statement_lines,
)
from bastion.policy.decision import Effect

ALICE = Identity("alice", ("dev",))
MALLORY = Identity("mallory", ())


def tool(name: str, server: str = "fs", trust: str = "trusted", **hints: bool) -> ToolEntry:
    return ToolEntry(f"{server}__{name}", server, name, {"name": name, "annotations": hints}, trust)


def target(entry: ToolEntry) -> Target:
    return Target.for_tool(ToolFacts.of(entry))


def write(tmp_path: Path, text: str, name: str = "p.cedar") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


POLICIES = '''
@id("devs-use-fs")
permit (principal in Bastion::Group::"dev", action == Bastion::Action::"call_tool", resource in Bastion::Server::"fs");

@id("no-delete")
forbid (principal, action == Bastion::Action::"call_tool", resource)
when { resource.name == "delete_file" };

@id("writes-need-approval")
@approval("required")
permit (principal in Bastion::Group::"dev", action == Bastion::Action::"call_tool", resource)
when { resource.server == "git" && resource.destructive };

@id("tmp-only-for-writes")
forbid (principal, action == Bastion::Action::"call_tool", resource)
when { resource.name == "write_file" && !(context.arguments.hasTag("path") && context.arguments.getTag("path") like "/tmp/*") };
'''


def test_allow_deny_and_approval(tmp_path: Path) -> None:
    engine = CedarAuthorizer.from_files([write(tmp_path, POLICIES)])
    read = engine.authorize(ALICE, "call_tool", target(tool("read_file")))
    assert read.effect is Effect.ALLOW and read.rule == "devs-use-fs"
    denied = engine.authorize(ALICE, "call_tool", target(tool("delete_file")))
    assert denied.effect is Effect.DENY and denied.rule == "no-delete"
    nobody = engine.authorize(MALLORY, "call_tool", target(tool("read_file")))
    assert nobody.effect is Effect.DENY and nobody.rule == "default-deny"
    push = engine.authorize(ALICE, "call_tool", target(tool("push", server="git", destructiveHint=True)))
    assert push.effect is Effect.APPROVAL and push.rule == "writes-need-approval"


def test_context_arguments_are_seen_and_not_cached_across_values(tmp_path: Path) -> None:
    engine = CedarAuthorizer.from_files([write(tmp_path, POLICIES)])
    write_tool = target(tool("write_file"))
    assert engine.authorize(ALICE, "call_tool", write_tool, {"path": "/tmp/a"}).effect is Effect.ALLOW
    assert engine.authorize(ALICE, "call_tool", write_tool, {"path": "/etc/passwd"}).effect is Effect.DENY
    assert engine.authorize(ALICE, "call_tool", write_tool, {"path": "/tmp/b"}).effect is Effect.ALLOW
    assert engine.authorize(ALICE, "call_tool", write_tool, {}).effect is Effect.DENY


def test_decisions_are_cached_by_what_policies_read(tmp_path: Path) -> None:
    text = 'permit (principal, action == Bastion::Action::"call_tool", resource) when { resource.read_only };'
    engine = CedarAuthorizer.from_files([write(tmp_path, text)])
    entry = target(tool("read", readOnlyHint=True))
    first = engine.authorize(ALICE, "call_tool", entry, {"x": 1}, SessionFacts("legacy"))
    # No policy reads the context, so other arguments and sessions reuse the same decision object.
    assert engine.authorize(ALICE, "call_tool", entry, {"x": 2}, SessionFacts("modern")) is first
    assert engine.authorize(MALLORY, "call_tool", entry) is not first


def test_session_facts_reach_policies(tmp_path: Path) -> None:
    text = 'permit (principal, action == Bastion::Action::"call_tool", resource) when { context.session.era == "modern" };'
    engine = CedarAuthorizer.from_files([write(tmp_path, text)])
    entry = target(tool("read"))
    assert engine.authorize(ALICE, "call_tool", entry, None, SessionFacts("modern")).allowed
    assert not engine.authorize(ALICE, "call_tool", entry, None, SessionFacts("legacy")).allowed


def test_rule_names_default_to_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, '// header\n\npermit (principal, action, resource);\n')
    engine = CedarAuthorizer.from_files([path])
    assert engine.rules == (f"{path}:3",)


def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'permit (principal, action, resource);\n\n// second\npermit (principal, action, resource)\n  when { true ;\n')
    with pytest.raises(PolicyLoadError, match=rf"^{path}:4: "):
        CedarAuthorizer.from_files([path])


def test_schema_error_names_file_and_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'permit (principal, action, resource);\npermit (principal, action == Bastion::Action::"call_tool", resource)\n'
        "  when { resource.no_such_attribute };\n",
    )
    with pytest.raises(PolicyLoadError, match=rf"^{path}:2: .*no_such_attribute"):
        CedarAuthorizer.from_files([path])


def test_unknown_action_is_a_schema_error(tmp_path: Path) -> None:
    path = write(tmp_path, 'permit (principal, action == Bastion::Action::"delete_everything", resource);')
    with pytest.raises(PolicyLoadError, match=str(path)):
        CedarAuthorizer.from_files([path])


def test_duplicate_ids_across_files(tmp_path: Path) -> None:
    one = write(tmp_path, '@id("x") permit (principal, action, resource);', "a.cedar")
    two = write(tmp_path, '@id("x") forbid (principal, action, resource);', "b.cedar")
    with pytest.raises(PolicyLoadError, match="already used"):
        CedarAuthorizer.from_files([one, two])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="cannot read"):
        CedarAuthorizer.from_files([tmp_path / "nope.cedar"])


def test_statement_lines_skip_strings_and_comments() -> None:
    text = '// a; b\npermit (principal, action, resource) when { "x;y" == "x;y" };\n\n@id("z;")\nforbid (principal, action, resource);'
    assert statement_lines(text) == [2, 4]


# --- the default policy ---------------------------------------------------------------------------------

DEFAULT = CedarAuthorizer.from_files([])


@pytest.mark.parametrize(
    "entry, effect",
    [
        (tool("read", trust="trusted", readOnlyHint=True), Effect.ALLOW),
        (tool("read", trust="untrusted", readOnlyHint=True), Effect.APPROVAL),  # untrusted hints are ignored
        (tool("write", trust="trusted", readOnlyHint=False, destructiveHint=False), Effect.APPROVAL),
        (tool("rm", trust="trusted", destructiveHint=True), Effect.APPROVAL),
        (tool("unannotated", trust="trusted"), Effect.APPROVAL),  # destructiveHint defaults to true
        # A server the user reviewed is believed about its tools, like a trusted one.
        (tool("read", trust="reviewed", readOnlyHint=True), Effect.ALLOW),
        (tool("rm", trust="reviewed", readOnlyHint=False, destructiveHint=True), Effect.APPROVAL),
        (tool("unannotated", trust="reviewed"), Effect.APPROVAL),
    ],
)
def test_default_policy(entry: ToolEntry, effect: Effect) -> None:
    assert DEFAULT.authorize(ALICE, "call_tool", target(entry)).effect is effect


def test_tool_facts_trust_annotations_only_from_trusted_servers() -> None:
    untrusted = ToolFacts.of(tool("x", trust="untrusted", readOnlyHint=True, destructiveHint=False, openWorldHint=False))
    assert (untrusted.read_only, untrusted.destructive, untrusted.open_world) == (False, True, True)
    trusted = ToolFacts.of(tool("x", trust="trusted", destructiveHint=False, openWorldHint=False, idempotentHint=True))
    assert (trusted.read_only, trusted.destructive, trusted.open_world, trusted.idempotent) == (False, False, False, True)
    reviewed = ToolFacts.of(tool("x", trust="reviewed", readOnlyHint=True, openWorldHint=False))
    assert (reviewed.read_only, reviewed.destructive, reviewed.open_world, reviewed.annotations_trusted) == \
        (True, False, False, True)


def test_default_server_requests() -> None:
    assert authorize_server_request(DEFAULT, ALICE, "fs", "elicitation/create").allowed
    assert authorize_server_request(DEFAULT, ALICE, "fs", "roots/list").allowed
    # Any server may ask for sampling; the sampling guardrail holds each request to its origin and budgets.
    for trust in ("untrusted", "reviewed", "trusted"):
        assert authorize_server_request(DEFAULT, ALICE, "fs", "sampling/createMessage", trust=trust).allowed
    assert not authorize_server_request(DEFAULT, ALICE, "fs", "tools/call").allowed


def test_default_allows_reading_resources_and_prompts() -> None:
    assert DEFAULT.authorize(ALICE, "read_resource", Target.for_resource("file:///x", "fs", "untrusted")).allowed
    assert DEFAULT.authorize(ALICE, "get_prompt", Target.for_prompt("p", "fs", "untrusted")).allowed
