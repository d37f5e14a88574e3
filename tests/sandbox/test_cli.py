"""``bastion sandbox doctor`` and ``bastion sandbox run`` as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


def bastion(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion", "sandbox", *args], input=stdin, capture_output=True,
                          text=True, cwd=REPO, timeout=60)


def test_doctor_reports_what_it_will_use():
    result = bastion("doctor", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["usable"]
    names = {check["name"]: check for check in report["checks"]}
    assert set(names) == {"bubblewrap", "proc", "user namespaces", "seccomp", "cgroups", "gvisor", "landlock"}
    assert names["user namespaces"]["ok"] and "65534" in names["user namespaces"]["detail"]
    assert report["will_use"]["resource limits"].split(" (")[0] in ("cgroup v1", "cgroup v2", "rlimits")


def _hierarchy_from_mountinfo() -> str:
    with open("/proc/self/mountinfo") as handle:
        types = {line.split(" - ", 1)[1].split(" ")[0] for line in handle}
    return {(True, True): "hybrid", (True, False): "v1", (False, True): "v2"}.get(
        ("cgroup" in types, "cgroup2" in types), "none")


def test_doctor_names_the_cgroup_hierarchy_and_the_controllers_the_limits_use():
    report = json.loads(bastion("doctor", "--json").stdout)
    cgroups = next(check for check in report["checks"] if check["name"] == "cgroups")
    assert report["will_use"]["cgroup hierarchy"] == _hierarchy_from_mountinfo()
    assert cgroups["detail"].startswith(f"hierarchy {_hierarchy_from_mountinfo()}: ")
    if cgroups["ok"]:
        assert "limits use cgroup v" in cgroups["detail"] and "memory at /" in cgroups["detail"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounting cgroupfs needs root")
def test_doctor_on_a_host_with_only_the_unified_hierarchy():
    # A private mount namespace where /sys/fs/cgroup is a cgroup2 mount and nothing else, as on current systemd hosts.
    script = ('umount -R /sys/fs/cgroup 2>/dev/null; mount -t cgroup2 none /sys/fs/cgroup && '
              f'exec {sys.executable} -m bastion sandbox doctor --json')
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    report = json.loads(done.stdout)
    cgroups = next(check for check in report["checks"] if check["name"] == "cgroups")
    assert report["will_use"]["cgroup hierarchy"] == "v2"
    with open("/sys/fs/cgroup/unified/cgroup.controllers" if os.path.isdir("/sys/fs/cgroup/unified")
              else "/sys/fs/cgroup/cgroup.controllers") as handle:
        offered = set(handle.read().split())
    if {"memory", "pids", "cpu"} <= offered:
        assert report["will_use"]["resource limits"].startswith("cgroup v2 (cpu, memory, pids)")
    else:  # every controller the limits need is bound to v1 on this host: the unified hierarchy cannot offer it
        assert not cgroups["ok"] and "cgroup2 at /sys/fs/cgroup with controllers" in cgroups["detail"]
        assert report["will_use"]["resource limits"].startswith("rlimits")


def test_doctor_human_report_goes_to_stderr():
    result = bastion("doctor")
    assert result.stdout == "" and "Bastion will use:" in result.stderr and "sandbox usable" in result.stderr


def test_run_passes_stdin_stdout_and_the_exit_status():
    result = bastion("run", "--quiet", "--", "/bin/sh", "-c", "cat; id -u; exit 7", stdin="piped in\n")
    assert result.returncode == 7
    assert result.stdout == "piped in\n65534\n"
    assert "exited with status 7" in result.stderr


def test_run_ends_the_commands_input_when_its_own_cannot_be_read():
    # Every read of this descriptor fails with EIO: this process's memory from address 0, never mapped.
    failing = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        result = subprocess.run([sys.executable, "-m", "bastion", "sandbox", "run", "--quiet", "--", "/bin/sh", "-c",
                                 "cat; echo input ended"], stdin=failing, capture_output=True, text=True, cwd=REPO,
                                timeout=60)
    finally:
        os.close(failing)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "input ended\n"
    assert "reading stdin failed" in result.stderr and "Traceback" not in result.stderr


def test_run_reports_the_memory_kill():
    result = bastion("run", "--quiet", "--memory", "64MiB", "--", "python3", "-c",
                     "b = bytearray(256 * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1")
    assert result.returncode == 137 and "killed: memory limit 64 MiB exceeded" in result.stderr


def test_run_grants(tmp_path):
    (tmp_path / "in.txt").write_text("granted")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = bastion("run", "--quiet", "--read-only", str(tmp_path / "in.txt"), "--writable", str(out_dir), "--",
                     "/bin/sh", "-c", f"cat {tmp_path}/in.txt > {out_dir}/copy.txt")
    assert result.returncode == 0, result.stderr
    assert (out_dir / "copy.txt").read_text() == "granted"


def test_run_announces_the_engine_and_limits():
    result = bastion("run", "--cpu", "0.5", "--pids", "16", "--", "/bin/true")
    assert result.returncode == 0 and "bwrap" in result.stderr and "cpu 0.5, pids 16" in result.stderr


def test_run_rejects_grants_with_profile_none():
    result = bastion("run", "--profile", "none", "--memory", "1GiB", "--", "/bin/true")
    assert result.returncode == 2 and "profile 'none'" in result.stderr


def test_run_needs_a_command():
    assert bastion("run").returncode == 2


def test_run_unknown_command():
    result = bastion("run", "--", "no-such-command-anywhere")
    assert result.returncode == 126 and "not found on PATH" in result.stderr


def _without_bwrap_on_path(tmp_path: Path) -> dict[str, str]:
    """The environment of a host with no bubblewrap installed: a PATH holding only ``id`` and ``sh``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("id", "sh"):
        (bin_dir / tool).symlink_to(f"/bin/{tool}")
    return {**os.environ, "PATH": str(bin_dir)}


def test_doctor_says_to_install_the_distributions_bubblewrap_when_there_is_none(tmp_path):
    env = _without_bwrap_on_path(tmp_path)
    as_json = subprocess.run([sys.executable, "-m", "bastion", "sandbox", "doctor", "--json"], capture_output=True,
                             text=True, cwd=REPO, timeout=60, env=env)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and not report["usable"]
    [engine] = [check for check in report["checks"] if check["name"] == "bubblewrap"]
    assert not engine["ok"] and "apt-get install bubblewrap" in engine["detail"] and "not on PATH" in engine["detail"]
    assert report["will_use"]["engine"] == "none: servers cannot be sandboxed"
    human = subprocess.run([sys.executable, "-m", "bastion", "sandbox", "doctor"], capture_output=True, text=True,
                           cwd=REPO, timeout=60, env=env)
    assert human.returncode == 1 and human.stdout == ""
    assert "apt-get install bubblewrap" in human.stderr and "dnf install bubblewrap" in human.stderr


def test_run_refuses_without_the_distributions_bubblewrap(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bastion", "sandbox", "run", "--quiet", "--", "/bin/true"],
                            capture_output=True, text=True, cwd=REPO, timeout=60, env=_without_bwrap_on_path(tmp_path))
    assert result.returncode != 0 and "apt-get install bubblewrap" in result.stderr
