"""The caller's Identity as the Cedar principal: scopes, how it authenticated, its issuer and the claims
``auth.claims.attributes`` names are attributes policies can read, and decisions are cached by them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.compose import build_policy
from bastion.config import GatewayConfig
from bastion.model import Identity, ToolEntry
from bastion.policy.cedar_engine import CedarAuthorizer, PolicyLoadError, PolicySource, Target, ToolFacts
from bastion.policy.decision import Effect

POLICY = '''
@id("writers")
permit (principal, action == Bastion::Action::"call_tool", resource)
when { principal.scopes.contains("mcp:write") && principal.tenant == "acme" };

@id("readers")
permit (principal, action == Bastion::Action::"list_tools", resource)
when { principal.scopes.contains("mcp:read") };

@id("only-our-issuer-by-token")
forbid (principal, action, resource)
when { principal.authenticated_by == "oauth" && principal.issuer != "https://id.example.com" };

@id("tenant-required")
forbid (principal, action == Bastion::Action::"call_tool", resource)
unless { principal.tenant != "" };
'''

TOOL = Target.for_tool(ToolFacts.of(ToolEntry("fs__write", "fs", "write", {"name": "fs__write"}, "trusted")))
SERVER = Target.for_server("fs", "trusted")
ISSUER = "https://id.example.com"


def token_caller(scopes: set[str], tenant: object = "acme", issuer: str = ISSUER, name: str = "alice") -> Identity:
    claims = {} if tenant is None else {"tenant": tenant}
    return Identity(name, ("staff",), "oauth", issuer, frozenset(scopes), claims, subject_token="eyJ-not-logged")


def authorizer() -> CedarAuthorizer:
    return CedarAuthorizer([PolicySource("identity.cedar", POLICY)], claim_attributes=["tenant"])


def test_scopes_and_a_claim_decide() -> None:
    cedar = authorizer()
    assert cedar.authorize(token_caller({"mcp:write"}), "call_tool", TOOL).rule == "writers"
    assert cedar.authorize(token_caller({"mcp:read"}), "call_tool", TOOL).effect is Effect.DENY
    assert cedar.authorize(token_caller({"mcp:write"}, tenant="other"), "call_tool", TOOL).effect is Effect.DENY
    assert cedar.authorize(token_caller({"mcp:read"}), "list_tools", SERVER).effect is Effect.ALLOW
    assert cedar.authorize(token_caller(set()), "list_tools", SERVER).effect is Effect.DENY


def test_issuer_and_method_are_attributes() -> None:
    cedar = authorizer()
    other = cedar.authorize(token_caller({"mcp:write"}, issuer="https://evil.example"), "call_tool", TOOL)
    assert other.effect is Effect.DENY and other.rule == "only-our-issuer-by-token"
    # An API key of the same name is not bound by the token rule; its claims are its own (none here).
    key = Identity("alice", ("staff",), "api_key", None, frozenset({"mcp:write"}), {"tenant": "acme"})
    assert cedar.authorize(key, "call_tool", TOOL).rule == "writers"


def test_a_claim_the_token_lacks_is_empty_and_a_forbid_on_it_still_applies() -> None:
    decision = authorizer().authorize(token_caller({"mcp:write"}, tenant=None), "call_tool", TOOL)
    assert decision.effect is Effect.DENY and decision.rule == "tenant-required"


def test_a_claim_that_is_not_a_string_is_its_json_text() -> None:
    cedar = CedarAuthorizer([PolicySource("p.cedar", '''
        @id("level") permit (principal, action == Bastion::Action::"call_tool", resource)
        when { principal.level == "3" && principal.teams == "[\\"a\\",\\"b\\"]" };''')], claim_attributes=["level", "teams"])
    caller = Identity("alice", (), "oauth", ISSUER, frozenset(), {"level": 3, "teams": ["a", "b"]})
    assert cedar.authorize(caller, "call_tool", TOOL).rule == "level"


def test_decisions_are_not_shared_between_callers_of_one_name_with_other_scopes() -> None:
    # Same name, same groups, same issuer: one cache entry would let a read-only token ride on a write token.
    cedar = authorizer()
    writer, reader = token_caller({"mcp:write"}), token_caller({"mcp:read"})
    assert writer == reader  # one caller, as sessions see it ...
    for _ in range(3):
        assert cedar.authorize(writer, "call_tool", TOOL).effect is Effect.ALLOW
        assert cedar.authorize(reader, "call_tool", TOOL).effect is Effect.DENY  # ... decided by each token


def test_an_attribute_nobody_configured_is_refused_at_start_with_the_fix() -> None:
    with pytest.raises(PolicyLoadError) as caught:
        CedarAuthorizer([PolicySource("identity.cedar", POLICY)])
    assert "identity.cedar:2" in str(caught.value) and "auth.claims.attributes" in str(caught.value)


@pytest.mark.parametrize("name", ["scopes", "issuer", "in", "9lives", "has-dash"])
def test_claim_attribute_names_must_be_usable_in_cedar(name: str) -> None:
    with pytest.raises(PolicyLoadError) as caught:
        CedarAuthorizer([PolicySource("p.cedar", "permit (principal, action, resource);")], claim_attributes=[name])
    assert "auth.claims.attributes" in str(caught.value) and repr(name) in str(caught.value)


def test_the_gateway_configuration_names_the_attributes(tmp_path: Path) -> None:
    (tmp_path / "identity.cedar").write_text(POLICY)
    config = GatewayConfig.model_validate({
        "servers": {},
        "policy": {"policy_files": [str(tmp_path / "identity.cedar")], "audit": {"enabled": False}},
        "auth": {"resource": "https://mcp.example.com/mcp", "issuers": [{"issuer": ISSUER}],
                 "claims": {"attributes": {"tenant": "tid"}}},
    })
    runtime = build_policy(config)
    assert runtime is not None
    assert runtime.engine.authorizer.authorize(token_caller({"mcp:write"}), "call_tool", TOOL).rule == "writers"


def test_policy_check_takes_scopes_and_claims(tmp_path: Path) -> None:
    (tmp_path / "identity.cedar").write_text(POLICY)
    (tmp_path / "bastion.toml").write_text(
        '[policy]\npolicy_files = ["identity.cedar"]\n[auth.claims.attributes]\ntenant = "tid"\n')
    tool = json.dumps({"name": "write"})

    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bastion", "policy", "check", str(tmp_path / "bastion.toml"),
                               "--identity", "alice", "--tool", "write", "--tool-def", tool, "--server", "fs",
                               "--trust", "trusted", *extra], capture_output=True, text=True, timeout=120)

    allowed = check("--scope", "mcp:write", "--claim", "tenant=acme", "--authenticated-by", "oauth", "--issuer", ISSUER)
    assert allowed.returncode == 0, allowed.stderr
    assert "rule writers" in allowed.stderr
    assert check("--scope", "mcp:read", "--claim", "tenant=acme").returncode == 3
    wrong_issuer = check("--scope", "mcp:write", "--claim", "tenant=acme", "--authenticated-by", "oauth",
                         "--issuer", "https://evil.example")
    assert wrong_issuer.returncode == 3 and "only-our-issuer-by-token" in wrong_issuer.stderr


def test_the_cache_keeps_attributes_a_condition_reaches_indirectly() -> None:
    # The principal inside a record: its tenant is read through the record, not as principal.tenant.
    cedar = CedarAuthorizer([PolicySource("p.cedar", '''
        @id("indirect") permit (principal, action == Bastion::Action::"call_tool", resource)
        when { {who: principal}.who.tenant == "acme" };''')], claim_attributes=["tenant"])
    assert cedar.authorize(token_caller(set(), tenant="acme"), "call_tool", TOOL).effect is Effect.ALLOW
    assert cedar.authorize(token_caller(set(), tenant="globex"), "call_tool", TOOL).effect is Effect.DENY
