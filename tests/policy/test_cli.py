"""``bastion policy check`` as a policy author's CI would run it: a real process, exit status as the answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = '''
[policy]
policy_files = ["team.cedar"]

[policy.identity]
name = "alice"
groups = ["dev"]

[[policy.guards]]
kind = "path"
tool = "fs/*"
argument = "path"
roots = ["{root}"]

[[policy.guards]]
kind = "url"
tool = "web/fetch"
argument = "url"
schemes = ["https"]

[[tools]]
server = "fs"
trust = "trusted"
tool = {{ name = "read_file", annotations = {{ readOnlyHint = true }}, inputSchema = {{ type = "object", properties = {{ path = {{ type = "string" }} }}, required = ["path"] }} }}

[[tools]]
server = "fs"
trust = "trusted"
tool = {{ name = "delete_file", annotations = {{ destructiveHint = true }}, inputSchema = {{ type = "object" }} }}

[[tools]]
server = "web"
tool = {{ name = "fetch", inputSchema = {{ type = "object", properties = {{ url = {{ type = "string" }} }} }} }}
'''

TEAM = '''
@id("read-only") permit (principal, action == Bastion::Action::"call_tool", resource) when { resource.read_only };
@id("devs-delete") @approval("required")
permit (principal in Bastion::Group::"dev", action == Bastion::Action::"call_tool", resource) when { resource.destructive };
'''


@pytest.fixture()
def config(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "team.cedar").write_text(TEAM)
    path = tmp_path / "bastion.toml"
    path.write_text(CONFIG.format(root=tmp_path / "data"))
    return path


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bastion", "policy", "check", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "identity, tool, arguments, status, words",
    [
        ("alice", "fs/read_file", {"path": "notes/today.md"}, 0, "decision: allow"),
        ("alice", "fs__read_file", {"path": "../../etc/passwd"}, 3, "outside the allowed directories"),
        # Free text is not shell-bound: metacharacters in it are nobody's business but the reader's.
        ("alice", "fs/read_file", {"path": "docs/café notes v1.2.md", "note": 'He said "a; b | c" && `x` $(y) > z'}, 0,
         "decision: allow"),
        ("alice", "read_file", {"path": 3}, 3, "schema:inputSchema"),
        ("alice", "delete_file", {"path": "x"}, 4, "decision: approval"),
        ("bob", "delete_file", {"path": "x"}, 3, "default-deny"),
        ("alice", "web/fetch", {"url": "https://example.com/"}, 4, "devs-delete"),  # untrusted: treated as destructive
    ],
)
def test_exit_status_and_reasons(config: Path, identity: str, tool: str, arguments: dict, status: int, words: str) -> None:
    done = check(str(config), "--identity", identity, "--tool", tool, "--args", json.dumps(arguments))
    assert done.returncode == status, done.stderr
    assert words in done.stderr and done.stdout == ""


def test_guard_runs_for_tool_def_given_on_the_command_line(config: Path, tmp_path: Path) -> None:
    definition = json.dumps({"name": "fetch", "annotations": {"readOnlyHint": True}})
    ok = check(str(config), "--identity", "alice", "--tool", "fetch", "--tool-def", definition, "--server", "web",
               "--trust", "trusted", "--args", '{"url": "https://example.com/a"}')
    assert ok.returncode == 0, ok.stderr
    bad = check(str(config), "--identity", "alice", "--tool", "fetch", "--tool-def", definition, "--server", "web",
                "--trust", "trusted", "--args", '{"url": "http://169.254.169.254/latest/meta-data/"}')
    assert bad.returncode == 3 and "url:web/fetch:url" in bad.stderr


def test_default_policy_without_a_config() -> None:
    definition = json.dumps({"name": "rm", "annotations": {"destructiveHint": True}})
    done = check("--identity", "me", "--tool", "rm", "--tool-def", definition, "--trust", "trusted")
    assert done.returncode == 4 and "default-other-tools-need-approval" in done.stderr


def test_broken_policy_file_is_a_usage_error_naming_file_and_line(config: Path, tmp_path: Path) -> None:
    (tmp_path / "team.cedar").write_text('permit (principal, action, resource);\npermit (principal, action, resource) when { resource.nope };\n')
    done = check(str(config), "--identity", "alice", "--tool", "read_file", "--args", '{"path": "a"}')
    assert done.returncode == 2 and f"{tmp_path / 'team.cedar'}:2:" in done.stderr


def test_unknown_config_key_is_named(config: Path) -> None:
    config.write_text(config.read_text().replace("[policy]\n", "[policy]\nschema_validaton = false\n"))
    done = check(str(config), "--identity", "alice", "--tool", "read_file", "--args", "{}")
    assert done.returncode == 2 and "schema_validaton" in done.stderr


def test_unknown_tool(config: Path) -> None:
    done = check(str(config), "--identity", "alice", "--tool", "nope", "--args", "{}")
    assert done.returncode == 2 and "not defined" in done.stderr
