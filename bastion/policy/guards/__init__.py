"""Argument guards: pure checks of one argument value, each returning a ``GuardResult``."""

from bastion.policy.guards.paths import PathRules, check_path
from bastion.policy.guards.schema import SchemaCache, check_schema
from bastion.policy.guards.shell import ShellRules, check_shell_argument
from bastion.policy.guards.urls import UrlRules, check_url

__all__ = [
    "PathRules",
    "SchemaCache",
    "ShellRules",
    "UrlRules",
    "check_path",
    "check_schema",
    "check_shell_argument",
    "check_url",
]
