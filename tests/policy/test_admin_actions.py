"""Operating the gateway is decided by Cedar like any call: the default policy lets group "admins" read the metrics
and the console and act from it, and nobody else; a policy of one's own may allow some acts and not others."""

from __future__ import annotations

from pathlib import Path

import pytest

from bastion.model import Identity
from bastion.policy.cedar_engine import CedarAuthorizer, authorize_admin
from bastion.policy.decision import Effect


def test_default_policy_lets_admins_operate_and_nobody_else() -> None:
    authorizer = CedarAuthorizer.from_files([])
    admin = Identity("ops", groups=("admins",))
    for action in ("view_metrics", "view_console", "administer"):
        assert authorize_admin(authorizer, admin, action, "approve").effect is Effect.ALLOW
        assert authorize_admin(authorizer, Identity("local"), action, "approve").effect is Effect.DENY
        assert authorize_admin(authorizer, Identity("eve", groups=("admin", "Admins")), action).effect is Effect.DENY


def test_a_policy_of_ones_own_may_allow_reading_and_forbid_one_act(tmp_path: Path) -> None:
    policy = tmp_path / "ops.cedar"
    policy.write_text('''
@id("oncall-reads") permit (principal in Bastion::Group::"oncall",
  action in [Bastion::Action::"view_console", Bastion::Action::"view_metrics"], resource);
@id("oncall-approves") permit (principal in Bastion::Group::"oncall", action == Bastion::Action::"administer",
  resource) when { context.operation == "approve" || context.operation == "deny" };
''')
    authorizer = CedarAuthorizer.from_files([policy])
    oncall = Identity("pat", groups=("oncall",))
    assert authorize_admin(authorizer, oncall, "view_console").effect is Effect.ALLOW
    assert authorize_admin(authorizer, oncall, "administer", "approve").rule == "oncall-approves"
    refused = authorize_admin(authorizer, oncall, "administer", "accept_tool_change")
    assert refused.effect is Effect.DENY
    # Only its own file is loaded: the default admins rule is not there.
    assert authorize_admin(authorizer, Identity("ops", groups=("admins",)), "view_console").effect is Effect.DENY


def test_an_unknown_action_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="not an operator's action"):
        authorize_admin(CedarAuthorizer.from_files([]), Identity("ops", groups=("admins",)), "call_tool")
