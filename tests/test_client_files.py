"""Configuration as clients write it, each feature seen through a real `bastion check` (and, where it changes what a
server receives, a real run): variables, envFile, relative paths, disabled, autoApprove, remote entries, and a
command that is not on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import BASTION, FIXTURES, NODE_BIN

RAW = [str(FIXTURES / "raw_server.py")]


def check(config: Path, *, env: dict[str, str] | None = None, cwd: str | Path = "/tmp") -> tuple[int, dict]:
    """``bastion check --json`` run from elsewhere than the file's folder: the exit code and the report."""
    done = subprocess.run([BASTION, "check", "--json", str(config)], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env={**os.environ, **(env or {})})
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def finding(report: dict, where: str) -> dict:
    found = [f for f in report["findings"] if f["where"] == where]
    assert found, f"no finding at {where}: {report['findings']}"
    return found[0]


def write(path: Path, body: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))
    return path


def test_vs_code_workspace_folder_is_the_folder_holding_dot_vscode(tmp_path):
    project = tmp_path / "project"
    config = write(project / ".vscode" / "mcp.json", {"servers": {"raw": {
        "type": "stdio", "command": sys.executable, "args": [*RAW, "${workspaceFolder}/data", "${workspaceFolderBasename}"]}}})
    status, report = check(config)
    assert status == 0, report
    assert report["servers"]["raw"]["args"][1:] == [str(project / "data"), "project"]


def test_elsewhere_workspace_folder_is_the_files_own_folder_and_user_home_is_home(tmp_path):
    config = write(tmp_path / "claude_desktop_config.json", {"mcpServers": {"raw": {
        "command": sys.executable, "args": [*RAW, "${workspaceFolder}", "${userHome}/notes"]}}})
    status, report = check(config, env={"HOME": str(tmp_path / "home")})
    assert status == 0, report
    assert report["servers"]["raw"]["args"][1:] == [str(tmp_path), str(tmp_path / "home" / "notes")]


def test_env_variables_expand_and_a_missing_one_is_an_error_naming_the_key(tmp_path):
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "vscode": {"command": sys.executable, "args": [*RAW, "${env:BASTION_TEST_ROOT}"]},
        "claude_code": {"command": sys.executable, "args": [*RAW, "${BASTION_TEST_ROOT}", "${BASTION_TEST_UNSET:-fallback}"]},
        "missing": {"command": sys.executable, "args": RAW, "env": {"TOKEN": "${env:BASTION_TEST_UNSET}"}},
    }})
    env = {"BASTION_TEST_ROOT": "/srv/root"}
    status, report = check(config, env=env)
    assert status == 2
    assert report["servers"]["vscode"]["args"][1:] == ["/srv/root"]
    assert report["servers"]["claude_code"]["args"][1:] == ["/srv/root", "fallback"]
    assert "missing" not in report["servers"]  # left out, not started half-configured
    error = finding(report, "mcpServers.missing.env.TOKEN")
    assert error["level"] == "error" and "BASTION_TEST_UNSET" in error["message"] and "set BASTION_TEST_UNSET" in error["fix"]


def test_input_variables_are_refused_unless_supplied_through_the_environment(tmp_path):
    config = write(tmp_path / ".vscode" / "mcp.json", {
        "inputs": [{"id": "api-key", "type": "promptString", "password": True}],
        "servers": {"raw": {"command": sys.executable, "args": RAW, "env": {"API_KEY": "${input:api-key}"}}}})
    status, report = check(config)
    assert status == 2 and report["ok"] is False
    refused = finding(report, "servers.raw.env.API_KEY")
    assert "cannot prompt" in refused["message"] and "BASTION_INPUT_API_KEY" in refused["fix"]
    status, report = check(config, env={"BASTION_INPUT_API_KEY": "s3cret"})
    assert status == 0 and report["servers"]["raw"]["env"] == ["API_KEY"]


def test_env_file_is_read_from_the_files_folder_and_a_missing_one_is_an_error(tmp_path):
    (tmp_path / "server.env").write_text("# for the raw server\nexport FROM_FILE=1\nQUOTED=\"two words\"\n")
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "raw": {"command": sys.executable, "args": RAW, "envFile": "server.env", "env": {"GIVEN": "x"}},
        "absent": {"command": sys.executable, "args": RAW, "envFile": "nowhere.env"},
    }})
    status, report = check(config)
    assert status == 2
    assert report["servers"]["raw"]["env"] == ["FROM_FILE", "GIVEN", "QUOTED"]
    error = finding(report, "mcpServers.absent.envFile")
    assert str(tmp_path / "nowhere.env") in error["message"] and "does not exist" in error["message"]


def test_variables_and_env_file_reach_the_server_as_its_client_would_pass_them(tmp_path):
    """End to end: the values expanded and read from the envFile are in the server's environment."""
    project = tmp_path / "project"
    (project / ".env").parent.mkdir(parents=True)
    (project / ".env").write_text("FROM_ENV_FILE=dotenv-value\n")
    config = write(project / ".vscode" / "mcp.json", {"servers": {"everything": {
        "type": "stdio", "command": str(NODE_BIN / "mcp-server-everything"), "args": ["stdio"],
        "envFile": "${workspaceFolder}/.env",
        "env": {"FROM_VARIABLE": "${env:BASTION_TEST_VALUE}", "FROM_INPUT": "${input:token}",
                "WORKSPACE": "${workspaceFolder}"},
        # Approved in advance, as VS Code users write it: runs under the default policy without a person.
        "autoApprove": ["get-env"],
    }}})
    env = {**os.environ, "BASTION_TEST_VALUE": "from-bastions-environment", "BASTION_INPUT_TOKEN": "typed-in"}
    done = subprocess.run([BASTION, "call", str(config), "everything__get-env", "-q"], capture_output=True, text=True,
                          timeout=180, cwd="/tmp", env=env)
    assert done.returncode == 0, done.stderr
    text = json.dumps(json.loads(done.stdout))
    for expected in ("dotenv-value", "from-bastions-environment", "typed-in", str(project)):
        assert expected in text


def test_relative_command_and_cwd_are_read_from_the_files_folder(tmp_path):
    folder = tmp_path / "cfg"
    (folder / "bin").mkdir(parents=True)
    (folder / "work").mkdir()
    (folder / "bin" / "python").symlink_to(sys.executable)
    config = write(folder / "mcp.json", {"policy": "off", "mcpServers": {
        "raw": {"command": "bin/python", "args": RAW, "cwd": "work"},
        "nowhere": {"command": "./bin/absent", "cwd": "missing"},
    }})
    status, report = check(config)
    assert report["servers"]["raw"]["command"] == str(folder / "bin" / "python")
    assert report["servers"]["raw"]["cwd"] == str(folder / "work")
    assert status == 2
    assert "does not exist" in finding(report, "mcpServers.nowhere.command")["message"]
    assert "not a directory" in finding(report, "mcpServers.nowhere.cwd")["message"]
    # And it runs so from any working directory.
    good = write(folder / "good.json", {"policy": "off", "mcpServers": {"raw": {"command": "bin/python", "args": RAW}}})
    listed = subprocess.run([BASTION, "tools", str(good), "-q"], capture_output=True, text=True, timeout=120, cwd="/")
    assert listed.returncode == 0, listed.stderr
    assert "raw__echo" in listed.stdout


@pytest.mark.parametrize("written", ["false", "true", "no"])
def test_disabled_given_as_text_is_refused(tmp_path, written):
    config = write(tmp_path / "mcp.json", {"mcpServers": {"raw": {"command": sys.executable, "disabled": written}}})
    status, report = check(config)
    assert status == 2 and "raw" not in report["servers"]
    refused = finding(report, "mcpServers.raw.disabled")
    assert repr(written) in refused["message"] and "true or false" in refused["fix"]


def test_disabled_as_a_boolean_is_read_and_its_variables_are_left_alone(tmp_path):
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "off": {"command": "not-installed-anywhere", "disabled": True, "env": {"T": "${env:BASTION_TEST_UNSET}"}},
        "on": {"command": sys.executable, "args": RAW, "disabled": False}}})
    status, report = check(config)
    assert status == 0, report["findings"]
    assert report["servers"]["off"]["enabled"] is False and report["servers"]["on"]["enabled"] is True


def test_auto_approve_and_always_allow_become_auto_approve_or_are_reported_ignored_with_policy_off(tmp_path):
    entry = {"command": sys.executable, "args": RAW}
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "claude": {**entry, "autoApprove": ["echo", "big"]}, "cline": {**entry, "alwaysAllow": ["echo"]}}})
    status, report = check(config)
    assert status == 0
    assert report["servers"]["claude"]["auto_approve"] == ["echo", "big"]
    assert report["servers"]["cline"]["auto_approve"] == ["echo"]
    off = write(tmp_path / "off.json", {"policy": "off", "mcpServers": {"claude": {**entry, "autoApprove": ["echo"]}}})
    status, report = check(off)
    assert status == 0  # a warning only
    ignored = finding(report, "mcpServers.claude.autoApprove")
    assert ignored["level"] == "warning" and "policy is off" in ignored["message"]
    bad = write(tmp_path / "bad.json", {"mcpServers": {"claude": {**entry, "autoApprove": "echo"}}})
    status, report = check(bad)
    assert status == 2 and "list of tool names" in finding(report, "mcpServers.claude.autoApprove")["message"]


def test_remote_entries_are_read_with_a_warning_naming_the_headers_they_are_sent(tmp_path):
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "remote": {"url": "https://example.invalid/mcp", "headers": {"Authorization": "Bearer ${env:HOME}"}},
        "windsurf": {"serverUrl": "https://example.invalid/sse"},
        "raw": {"command": sys.executable, "args": RAW}}})
    status, report = check(config)
    assert status == 0 and list(report["servers"]) == ["remote", "windsurf", "raw"]
    assert report["servers"]["remote"]["headers"] == ["Authorization"]
    assert os.environ["HOME"] not in json.dumps(report)  # names only: a header's value may be a secret
    for name in ("remote", "windsurf"):
        warned = finding(report, f"mcpServers.{name}.url")
        assert warned["level"] == "warning" and "not sandboxed" in warned["message"]
    assert "Authorization" in finding(report, "mcpServers.remote.url")["message"]


def test_a_command_not_on_path_or_not_executable_is_an_error_with_the_fix(tmp_path):
    text_file = tmp_path / "server.py"
    text_file.write_text("print('not executable')\n")
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "missing": {"command": "bastion-test-no-such-server"},
        "plain": {"command": str(text_file)},
        "raw": {"command": sys.executable, "args": RAW}}})
    status, report = check(config)
    assert status == 2 and report["ok"] is False
    missing = finding(report, "mcpServers.missing.command")
    assert "not on PATH" in missing["message"] and "full path" in missing["fix"]
    assert "not an executable" in finding(report, "mcpServers.plain.command")["message"]
    assert not [f for f in report["findings"] if f["where"].startswith("mcpServers.raw")]


def test_check_without_json_says_each_finding_on_stderr_and_nothing_on_stdout(tmp_path):
    config = write(tmp_path / "mcp.json", {"mcpServers": {
        "missing": {"command": "bastion-test-no-such-server"}, "remote": {"url": "https://example.invalid/mcp"}}})
    done = subprocess.run([BASTION, "check", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert "error: mcpServers.missing.command: 'bastion-test-no-such-server' is not on PATH — fix:" in done.stderr
    assert "warning: mcpServers.remote.url: a remote server: not sandboxed" in done.stderr
    assert "1 error(s), 1 warning(s)" in done.stderr


def test_check_json_reports_a_file_that_does_not_load_with_its_findings(tmp_path):
    config = write(tmp_path / "mcp.json", {"mcpServers": {"a": {"comand": "x"}}})
    status, report = check(config)
    assert status == 2 and report["ok"] is False and report["file"] == str(config)
    assert {f["where"] for f in report["findings"]} >= {"mcpServers.a.comand", "mcpServers.a.command"}


def test_check_reports_a_policy_that_does_not_load_and_says_when_policy_is_off(tmp_path):
    (tmp_path / "team.cedar").write_text("permit(principal, action, resource")
    broken = write(tmp_path / "broken.json", {"servers": {}, "policy": {"policy_files": ["team.cedar"]}})
    status, report = check(broken)
    assert status == 2 and report["policy"] is None
    assert str(tmp_path / "team.cedar") in finding(report, "policy")["message"]
    off = write(tmp_path / "off.json", {"servers": {}, "policy": "off"})
    status, report = check(off)
    assert status == 0 and report["policy"] == "off"


def test_a_client_files_own_top_level_settings_are_ignored_with_a_warning(tmp_path):
    config = write(tmp_path / "claude_desktop_config.json", {
        "globalShortcut": "Ctrl+Space", "mcpServers": {"raw": {"command": sys.executable, "args": RAW}}})
    status, report = check(config)
    assert status == 0 and list(report["servers"]) == ["raw"]
    assert "globalShortcut" in finding(report, "(top level)")["message"]
