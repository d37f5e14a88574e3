"""``policy.undeclared_arguments``: argument names the tool's input schema does not declare are refused."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bastion.model import ToolEntry
from bastion.policy.config import PolicyConfig
from bastion.policy.decision import Effect
from bastion.policy.engine import UNDECLARED_RULE, PolicyEngine
from bastion.policy.guards.schema import declared_keys, undeclared_keys

OPEN_SCHEMA = {  # says nothing against extra keys: additionalProperties defaults to true
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "options": {"type": "object", "properties": {"mode": {"type": "string"}}},
        "files": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "free": {"type": "object"},
    },
}


def entry(schema: Any, trust: str = "untrusted") -> ToolEntry:
    return ToolEntry("fs__write", "fs", "write", {"name": "fs__write", "inputSchema": schema}, trust)


def engine(**policy: Any) -> PolicyEngine:
    return PolicyEngine(PolicyConfig.model_validate(policy))


def test_declared_keys_only_pass() -> None:
    decision = engine().check_arguments(entry(OPEN_SCHEMA), {"path": "a", "options": {"mode": "w"},
                                                              "files": [{"name": "x"}], "free": {"any": 1}})
    assert decision.effect is Effect.ALLOW


def test_an_extra_top_level_key_is_refused_whatever_additional_properties_says() -> None:
    for schema in (OPEN_SCHEMA, {**OPEN_SCHEMA, "additionalProperties": True},
                   {**OPEN_SCHEMA, "additionalProperties": {"type": "string"}}):
        decision = engine().check_arguments(entry(schema), {"path": "a", "exfil": "the secret"})
        assert decision.effect is Effect.DENY and decision.rule == UNDECLARED_RULE
        assert "'/exfil'" in decision.reason and 'policy.undeclared_arguments = "refuse_untrusted"' in decision.reason
        assert "the secret" not in decision.reason


def test_nested_keys_are_checked_where_the_schema_declares_properties() -> None:
    check = engine().check_arguments
    assert check(entry(OPEN_SCHEMA), {"options": {"mode": "w", "extra": 1}}).rule == UNDECLARED_RULE
    assert "'/files/1/extra'" in (check(entry(OPEN_SCHEMA), {"files": [{"name": "a"}, {"extra": 1}]}).reason or "")
    # An object whose schema declares no properties is free-form below the top level.
    assert check(entry(OPEN_SCHEMA), {"free": {"anything": 1}}).effect is Effect.ALLOW


def test_a_schema_without_properties_declares_nothing() -> None:
    check = engine().check_arguments
    assert check(entry({"type": "object"}), {}).effect is Effect.ALLOW
    decision = check(entry({"type": "object"}), {"anything": 1})
    assert decision.effect is Effect.DENY and decision.rule == UNDECLARED_RULE


def test_reviewed_and_trusted_servers_pass_under_the_default_and_refuse_covers_them() -> None:
    for trust in ("reviewed", "trusted"):
        assert engine().check_arguments(entry(OPEN_SCHEMA, trust), {"exfil": 1}).effect is Effect.ALLOW
        refused = engine(undeclared_arguments="refuse").check_arguments(entry(OPEN_SCHEMA, trust), {"exfil": 1})
        assert refused.rule == UNDECLARED_RULE and '= "refuse"' in refused.reason


def test_allow_turns_it_off() -> None:
    assert engine(undeclared_arguments="allow").check_arguments(entry(OPEN_SCHEMA), {"exfil": 1}).effect is Effect.ALLOW


def test_the_setting_is_validated() -> None:
    with pytest.raises(ValidationError, match="refuse_untrusted"):
        PolicyConfig.model_validate({"undeclared_arguments": "off"})


def test_long_keys_are_cut_short_and_many_are_counted() -> None:
    decision = engine().check_arguments(entry(OPEN_SCHEMA), {"k" * 500: 1, "a": 1, "b": 1, "c": 1, "d/~": 1})
    assert "k" * 41 not in decision.reason and "and 2 more" in decision.reason
    assert undeclared_keys({"d/~": 1}, declared_keys(OPEN_SCHEMA)) == ["/d~1~0"]


def test_declared_key_sets_are_worked_out_once_per_tool() -> None:
    policy = engine()
    tool = entry(OPEN_SCHEMA)
    plan = policy.argument_plan(tool)
    assert plan.declared is not None and plan.declared.keys == {"path", "options", "files", "free"}
    assert policy.argument_plan(tool) is plan


def test_a_server_of_its_own_is_strict_while_the_others_keep_the_gateway_setting() -> None:
    # A trusted server is spared by the default; its own key makes it strict, and the refusal names that key.
    strict = engine(servers={"fs": {"undeclared_arguments": "refuse"}})
    decision = strict.check_arguments(entry(OPEN_SCHEMA, "trusted"), {"path": "a", "exfil": "x"})
    assert decision.rule == UNDECLARED_RULE
    assert 'policy.servers.fs.undeclared_arguments = "refuse"' in (decision.reason or "")
    other = ToolEntry("gh__write", "gh", "write", {"name": "gh__write", "inputSchema": OPEN_SCHEMA}, "trusted")
    assert strict.check_arguments(other, {"path": "a", "exfil": "x"}).effect is Effect.ALLOW


def test_one_untrusted_server_may_be_allowed_free_form_arguments() -> None:
    lenient = engine(servers={"fs": {"undeclared_arguments": "allow"}})
    assert lenient.check_arguments(entry(OPEN_SCHEMA), {"path": "a", "extra": 1}).effect is Effect.ALLOW
    other = ToolEntry("gh__write", "gh", "write", {"name": "gh__write", "inputSchema": OPEN_SCHEMA}, "untrusted")
    assert lenient.check_arguments(other, {"path": "a", "extra": 1}).rule == UNDECLARED_RULE


def test_a_wrong_per_server_value_names_the_key_and_the_choices() -> None:
    with pytest.raises(ValidationError) as caught:
        engine(servers={"fs": {"undeclared_arguments": "yes"}})
    assert "policy.servers.<name>.undeclared_arguments is 'yes'" in str(caught.value)
    assert '"allow"' in str(caught.value)


def test_a_per_server_setting_for_a_server_not_configured_is_an_error(tmp_path) -> None:
    import json
    import subprocess
    import sys

    config = tmp_path / "bastion.json"
    config.write_text(json.dumps({"servers": {"fs": {"command": "true"}},
                                  "policy": {"servers": {"sf": {"undeclared_arguments": "allow"}}}}))
    checked = subprocess.run([sys.executable, "-m", "bastion", "check", str(config)], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 2 and "policy.servers names 'sf'" in checked.stderr, checked.stderr
