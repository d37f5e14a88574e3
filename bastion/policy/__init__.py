"""Policy gateway: Cedar authorization, argument guards, human approval, rate limits and an audit trail."""

from bastion.policy.cedar_engine import CedarAuthorizer, PolicyLoadError, authorize_server_request
from bastion.policy.config import PolicyConfig
from bastion.policy.decision import Decision, Effect
from bastion.policy.dryrun import DecisionReport, dry_run
from bastion.policy.engine import PolicyEngine
from bastion.policy.interceptors import PolicyRuntime, build_policy_interceptors, build_policy_runtime

__all__ = [
    "CedarAuthorizer",
    "Decision",
    "DecisionReport",
    "Effect",
    "PolicyConfig",
    "PolicyEngine",
    "PolicyLoadError",
    "PolicyRuntime",
    "authorize_server_request",
    "build_policy_interceptors",
    "build_policy_runtime",
    "dry_run",
]
