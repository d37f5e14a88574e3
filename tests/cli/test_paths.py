"""Default paths follow XDG_STATE_HOME / XDG_CONFIG_HOME / XDG_CACHE_HOME as they are when used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bastion import paths
from bastion.policy.config import ApprovalConfig, AuditConfig, PolicyConfig


def test_the_variables_are_read_when_asked_not_at_import(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert paths.state_dir() == tmp_path / "state" / "bastion"
    assert paths.config_dir() == tmp_path / "config" / "bastion"
    assert paths.cache_dir() == tmp_path / "cache" / "bastion"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "elsewhere"))
    assert paths.state_dir() == tmp_path / "elsewhere" / "bastion"


def test_unset_empty_or_relative_variables_fall_back_to_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG specification: ignore a relative path
    assert paths.state_dir() == tmp_path / ".local" / "state" / "bastion"
    assert paths.config_dir() == tmp_path / ".config" / "bastion"
    assert paths.cache_dir() == tmp_path / ".cache" / "bastion"


def test_policy_defaults_follow_the_state_home_when_the_configuration_is_built(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "one"))
    first = PolicyConfig()
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "two"))
    second = PolicyConfig()
    assert Path(first.audit.path) == tmp_path / "one" / "bastion" / "audit.jsonl"
    assert Path(first.approval.queue_dir) == tmp_path / "one" / "bastion" / "approvals"
    assert Path(second.audit.path) == tmp_path / "two" / "bastion" / "audit.jsonl"
    assert Path(ApprovalConfig().queue_dir) == tmp_path / "two" / "bastion" / "approvals"
    # A path the configuration gives is kept as given.
    assert AuditConfig(path="/srv/audit.jsonl").path == "/srv/audit.jsonl"


def test_the_embedding_cache_and_demo_scratch_follow_the_variables(monkeypatch, tmp_path):
    from bastion.config import state_dir
    from bastion.search.embedding import default_cache_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert state_dir() == tmp_path / "state" / "bastion"
    assert default_cache_dir() == tmp_path / "cache" / "bastion" / "embeddings"


def test_approve_looks_in_the_queue_under_the_state_home_of_its_run(tmp_path):
    """`bastion approve ID` without --queue-dir looks in $XDG_STATE_HOME/bastion/approvals, not in the home."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "bastion", "approve", "0123abcd"], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 1
    assert str(tmp_path / "state" / "bastion" / "approvals") in done.stderr
    assert "/home/" not in done.stderr.replace(str(tmp_path), "")
