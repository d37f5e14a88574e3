"""deploy/systemd/bastion.service, the unit docs/deploy.md ("One host") shows: `systemd-analyze verify` accepts it
(every key known, the commands executable, with this checkout's bastion standing in for /opt/bastion's), and it sets
none of the hardening options that would take bubblewrap's namespaces, mount(2) or an unmasked /proc away. The
tests do not run it under systemd."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.dockerfile import ROOT
from tests.support import BASTION

UNIT = ROOT / "deploy" / "systemd" / "bastion.service"
BREAK_THE_SANDBOX = ("RestrictNamespaces", "SystemCallFilter", "ProtectKernelTunables", "ProtectKernelLogs",
                     "ProtectProc")


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # keys are case-sensitive in systemd
    parser.read_string(UNIT.read_text())
    return parser["Service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path):
    unit = tmp_path / "bastion.service"
    unit.write_text(UNIT.read_text().replace("/opt/bastion/bin/bastion", BASTION))
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stderr
    assert "Unknown key" not in verified.stderr and "ignoring" not in verified.stderr, verified.stderr


def test_the_unit_keeps_what_the_sandbox_needs():
    settings = service()
    assert not set(BREAK_THE_SANDBOX) & set(settings), set(BREAK_THE_SANDBOX) & set(settings)
    assert settings["User"] != "root" and settings["NoNewPrivileges"] == "yes"
    assert settings["ExecStart"].split()[1:3] == ["serve", "/etc/bastion/bastion.toml"]
    assert "XDG_STATE_HOME=/var/lib/bastion" in settings["Environment"] and settings["StateDirectory"] == "bastion"
    assert settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert settings["Delegate"] == "yes"
    shown = (ROOT / "docs" / "deploy.md").read_text()
    for key in ("ExecStart", "ExecReload", "User", "Environment", "Delegate", "ProtectSystem"):
        assert f"{key}={settings[key]}\n" in shown, key  # the docs show the unit as it is
