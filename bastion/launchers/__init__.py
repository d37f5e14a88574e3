"""Servers started by package launchers (``npx``, ``uvx``, ``pipx run``, ``bunx``), installed outside the sandbox.

``plan`` reads the command line (pure), ``install`` runs the host's package client into Bastion's cache,
``lock`` keeps the exact versions beside the configuration, ``prepare`` puts them together for each start.
"""

from bastion.launchers.install import Installed, PackageInstallFailed
from bastion.launchers.plan import LaunchPlan, NotALauncher, plan_launch

__all__ = ["Installed", "LaunchPlan", "NotALauncher", "PackageInstallFailed", "plan_launch"]
