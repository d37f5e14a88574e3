"""Grant inference from how a server is started, and the review of what it may do."""

from __future__ import annotations

import pytest

from bastion.clients.grants import infer_grants, merge_sandbox, package_name, review


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home" / "ana"
    for folder in ("Documents", "Desktop", "code/repo", ".ssh"):
        (home / folder).mkdir(parents=True)
    return home


def filesystem(*folders: str) -> dict:
    return {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", *folders]}


def test_a_filesystem_servers_folders_are_writable(home):
    inference = infer_grants("files", filesystem(f"{home}/Documents", "~/Desktop"), home=str(home))
    assert inference.sandbox == {"writable": [f"{home}/Documents", f"{home}/Desktop"]}
    assert inference.warnings == ()
    assert any("~/Documents" in reason for reason in inference.reasons)


@pytest.mark.parametrize("start", [
    {"command": "mcp-server-filesystem", "args": []},
    {"command": "/opt/app/node_modules/.bin/mcp-server-filesystem", "args": []},
    {"command": "node", "args": ["/opt/x/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"]},
    {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem@2026.8.31"]},
    {"command": "bunx", "args": ["@modelcontextprotocol/server-filesystem"]},
])
def test_the_filesystem_server_is_recognised_however_it_is_started(home, start):
    entry = {**start, "args": [*start["args"], f"{home}/Documents"]}
    assert infer_grants("files", entry, home=str(home)).sandbox == {"writable": [f"{home}/Documents"]}


def test_the_home_directory_is_not_granted_whole_without_the_flag(home):
    inference = infer_grants("files", filesystem(str(home), f"{home}/Documents"), home=str(home))
    assert inference.sandbox == {"writable": [f"{home}/Documents"]}
    assert len(inference.warnings) == 1 and "home directory ~ whole" in inference.warnings[0]
    assert "--allow-home" in inference.warnings[0]


def test_the_home_directory_with_the_flag_is_granted_and_said(home):
    inference = infer_grants("files", filesystem("~"), home=str(home), allow_home=True)
    assert inference.sandbox == {"writable": [str(home)]}
    assert "granted whole" in inference.warnings[0]


@pytest.mark.parametrize("folder", ["/", "HOME_PARENT"])
def test_the_root_and_the_homes_parents_are_never_granted(home, folder):
    folder = str(home.parent) if folder == "HOME_PARENT" else folder
    inference = infer_grants("files", filesystem(folder), home=str(home), allow_home=True)
    assert inference.sandbox == {}
    assert "not granting" in inference.warnings[0]


def test_a_missing_folder_or_an_unresolvable_relative_one_is_reported_not_granted(home):
    inference = infer_grants("files", filesystem(f"{home}/gone", "notes"), home=str(home))
    assert inference.sandbox == {}
    assert "does not exist" in inference.warnings[0] and "relative path" in inference.warnings[1]
    resolved = infer_grants("files", filesystem("Documents"), home=str(home), base_dir=str(home))
    assert resolved.sandbox == {"writable": [f"{home}/Documents"]}


def test_credentials_folders_are_granted_when_listed_but_said(home):
    inference = infer_grants("files", filesystem("~/.ssh"), home=str(home))
    assert inference.sandbox == {"writable": [f"{home}/.ssh"]}
    assert "holds credentials" in inference.warnings[0]


@pytest.mark.parametrize("args", [["--repository", "REPO"], ["-r", "REPO"], ["--repository=REPO"]])
def test_the_git_servers_repository_is_writable(home, args):
    args = [arg.replace("REPO", f"{home}/code/repo") for arg in args]
    for entry in ({"command": "uvx", "args": ["mcp-server-git", *args]},
                  {"command": "python", "args": ["-m", "mcp_server_git", *args]}):
        assert infer_grants("git", entry, home=str(home)).sandbox == {"writable": [f"{home}/code/repo"]}


def test_known_services_get_their_host_and_unknown_servers_nothing(home):
    github = infer_grants("gh", {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"]},
                          home=str(home))
    assert github.sandbox == {"network": ["api.github.com:443"]}
    unknown = infer_grants("x", {"command": "npx", "args": ["-y", "some-server", f"{home}/Documents"]},
                           home=str(home))
    assert unknown.sandbox == {} and unknown.warnings == ()


def test_explicit_sandbox_settings_win():
    inferred = {"writable": ["/data/a", "/data/b"]}
    assert merge_sandbox(None, inferred) == {"writable": ["/data/a", "/data/b"]}
    assert merge_sandbox("none", inferred) == "none"
    assert merge_sandbox("strict", inferred) == {"profile": "strict", "writable": ["/data/a", "/data/b"]}
    explicit = {"read_only": ["/data/a"], "writable": ["/data/c"], "memory": "256MiB"}
    assert merge_sandbox(explicit, inferred) == {"read_only": ["/data/a"], "writable": ["/data/c", "/data/b"],
                                                 "memory": "256MiB"}


@pytest.mark.parametrize("token, name", [
    ("@modelcontextprotocol/server-filesystem@1.2.3", "@modelcontextprotocol/server-filesystem"),
    ("mcp-server-git==2026.1.1", "mcp-server-git"),
    ("mcp-server-git@latest", "mcp-server-git"),
    ("/usr/local/bin/mcp-server-git", "mcp-server-git"),
    ("/p/node_modules/@scope/pkg/dist/index.js", "@scope/pkg"),
    ("/p/node_modules/pkg/index.js", "pkg"),
])
def test_package_names(token, name):
    assert package_name(token) == name


def test_the_review_says_what_a_server_may_read_write_reach_and_receive(home):
    server = {"command": "npx", "args": ["-y", "pkg", f"{home}/code"], "env": {"API_KEY": "secret-value"},
              "sandbox": {"writable": [f"{home}/Documents"], "network": ["api.example.com:443"], "env": ["TOKEN"]}}
    text = "\n".join(review("s", server, home=str(home)).lines())
    assert "writes:   ~/Documents" in text
    assert "reads:    ~/Documents, ~/code" in text
    assert "reaches:  api.example.com:443" in text
    assert "API_KEY (set in the configuration)" in text and "TOKEN (passed from your environment)" in text
    assert "secret-value" not in text
    unsandboxed = "\n".join(review("s", {"command": "x", "sandbox": "none"}, home=str(home)).lines())
    assert "NOT SANDBOXED" in unsandboxed


def test_an_unknown_server_whose_arguments_name_the_home_is_warned_once(home):
    inference = infer_grants("x", {"command": "npx", "args": ["-y", "some-server", "--root=~", str(home)]},
                             home=str(home))
    assert inference.sandbox == {}
    assert len(inference.warnings) == 1 and "name ~, which the sandbox does not show" in inference.warnings[0]
    # the filesystem server's own warning about the home is not repeated
    assert len(infer_grants("files", filesystem(str(home)), home=str(home)).warnings) == 1
