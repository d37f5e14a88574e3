"""OS sandbox for local (stdio) MCP servers: bubblewrap namespaces, seccomp, cgroups, an egress proxy.

Every stdio server is started through :func:`spawn`, sandboxed or not, so starting and stopping
processes lives in one place.
"""

from bastion.sandbox.config import PROFILES, SandboxConfig
from bastion.sandbox.process import LaunchPlan, SandboxError, ServerProcess, spawn

__all__ = ["PROFILES", "LaunchPlan", "SandboxConfig", "SandboxError", "ServerProcess", "spawn"]
