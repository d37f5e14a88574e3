"""What the sandbox exposes: runtime discovery, argument paths, mount order, the bwrap command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bastion.sandbox import SandboxConfig
from bastion.sandbox.engine import find_engine
from bastion.sandbox.process import INNER_SHIM, plan_sandbox
from bastion.sandbox.view import Mount, arg_paths, order_mounts, runtime_paths

REPO = Path(__file__).parents[2]
VENV = str(REPO / ".venv")


def test_a_venv_console_script_binds_the_venv_and_the_base_interpreter_only():
    binds, path_dirs = runtime_paths(f"{VENV}/bin/mcp-server-time", os.environ["PATH"])
    base_prefix = os.path.realpath(sys.base_prefix)
    assert VENV in binds
    assert base_prefix in binds
    home = os.path.expanduser("~")
    assert home not in binds, "the whole home must never be bound"
    assert all(b == VENV or b == base_prefix for b in binds), binds
    assert f"{VENV}/bin" in path_dirs


def test_system_executables_need_no_extra_binds():
    binds, _ = runtime_paths("/usr/bin/env", os.environ["PATH"])
    assert binds == []


def test_arguments_naming_existing_paths(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    home = os.path.expanduser("~")
    found = arg_paths([str(data), f"--root={data}", "/does/not/exist", "plain-word", "/", "/proc/self", home + "/..",
                       os.path.dirname(home)], None, home)
    assert found == [str(data)]  # named twice, bound once


def test_parents_are_mounted_before_children_and_writable_wins():
    mounts = [Mount("ro", "/root/.pyenv/versions/3.11", "/x"), Mount("tmpfs", "/root"),
              Mount("ro", "/srv/data", "/srv/data"), Mount("rw", "/srv/data", "/srv/data"), Mount("ro", "/srv", "/srv")]
    ordered = order_mounts(mounts)
    dests = [(m.kind, m.dest) for m in ordered]
    assert dests.index(("tmpfs", "/root")) < dests.index(("ro", "/root/.pyenv/versions/3.11"))
    assert ("ro", "/srv/data") not in dests and dests.index(("ro", "/srv")) < dests.index(("rw", "/srv/data"))


def test_the_bwrap_command_line(tmp_path):
    writable = tmp_path / "out"
    writable.mkdir()
    config = SandboxConfig(writable=(str(writable),), env=("TERM",))
    plan = plan_sandbox(find_engine(), "/bin/cat", [], {"TOKEN": "x"}, None, config, str(tmp_path), None)
    argv = plan.argv
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
                 "--unshare-cgroup", "--disable-userns", "--die-with-parent", "--new-session"):
        assert flag in argv
    assert argv[argv.index("--uid") + 1] == "65534" and argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--chdir") + 1] == "/"
    assert ["--bind", str(writable), str(writable)] == argv[argv.index("--bind"):argv.index("--bind") + 3]
    # The server is executed by a shell that hands it its stdin and stdout (see process.py, HANDOVER_STDIN).
    assert argv[-6:] == ["--", "/bin/sh", "-c", INNER_SHIM, "bastion-sandbox", "/bin/cat"]
    assert "TOKEN" not in " ".join(argv), "secrets travel in the environment, never on the command line"
    assert plan.env["TOKEN"] == "x" and "/etc/shadow" not in argv
    etc = [m.dest for m in plan.mounts if m.dest.startswith("/etc")]
    assert "/etc/passwd" in etc and not any(e in etc for e in ("/etc/shadow", "/etc/sudoers", "/etc"))


def test_a_node_package_binary_binds_its_node_modules_tree():
    binary = REPO / "node_modules" / ".bin" / "mcp-server-filesystem"
    if not binary.exists():
        import pytest

        pytest.skip("node_modules not installed")
    binds, _ = runtime_paths(str(binary), os.environ["PATH"])
    assert binds == [str(REPO / "node_modules")]


def test_a_venv_program_pip_wrapped_in_sh_binds_the_interpreter_its_venv_links_to(tmp_path):
    # Past 127 characters of #! line pip writes this wrapper, which names the venv's python only in shell words.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    program = venv / "bin" / "mcp-server-time"
    program.write_text(f"#!/bin/sh\n'''exec' {venv}/bin/python \"$0\" \"$@\"\n' '''\nimport sys\n")
    program.chmod(0o755)
    binds, _ = runtime_paths(str(program), os.environ["PATH"])
    base = os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(venv / "bin" / "python")), ".."))
    assert str(venv) in binds
    assert base in binds or base.startswith("/usr/"), binds
