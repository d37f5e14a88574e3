"""The command lines of published MCP configurations, read into what to install and what to run."""

from __future__ import annotations

import pytest

from bastion.launchers.plan import NotALauncher, plan_launch


def test_npx_with_yes_and_a_scoped_package() -> None:
    plan = plan_launch("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data", "/notes"])
    assert plan is not None
    assert (plan.ecosystem, plan.package, plan.requested, plan.pinned, plan.bin) == (
        "npm", "@modelcontextprotocol/server-filesystem", "@modelcontextprotocol/server-filesystem", None, None)
    assert plan.args == ("/data", "/notes")


def test_npx_version_forms() -> None:
    pinned = plan_launch("/usr/local/bin/npx", ["--yes", "@scope/server@1.2.3", "--flag"])
    ranged = plan_launch("npx", ["server-x@^2", "-y"])
    assert pinned is not None and ranged is not None
    assert (pinned.package, pinned.pinned, pinned.args) == ("@scope/server", "1.2.3", ("--flag",))
    # options after the package belong to the server, as npx reads them
    assert (ranged.package, ranged.requested, ranged.pinned, ranged.args) == ("server-x", "server-x@^2", None, ("-y",))


def test_npx_package_option_names_the_program() -> None:
    plan = plan_launch("npx", ["-y", "--package=@acme/tools@3.0.0", "acme-mcp", "serve"])
    assert plan is not None
    assert (plan.package, plan.pinned, plan.bin, plan.args) == ("@acme/tools", "3.0.0", "acme-mcp", ("serve",))
    separate = plan_launch("npx", ["-p", "@acme/tools", "acme-mcp"])
    assert separate is not None and separate.bin == "acme-mcp"


def test_bunx_is_read_like_npx() -> None:
    plan = plan_launch("bunx", ["@modelcontextprotocol/server-memory"])
    assert plan is not None and (plan.launcher, plan.ecosystem, plan.package) == ("bunx", "npm", "@modelcontextprotocol/server-memory")
    assert plan_launch("bun", ["x", "pkg"]) is not None


def test_uvx_forms() -> None:
    plain = plan_launch("uvx", ["mcp-server-time", "--local-timezone", "UTC"])
    assert plain is not None
    assert (plain.ecosystem, plain.package, plain.requested, plain.bin, plain.args) == (
        "python", "mcp-server-time", "mcp-server-time", "mcp-server-time", ("--local-timezone", "UTC"))
    at = plan_launch("/home/me/.local/bin/uvx", ["mcp-server-fetch@2025.1.1"])
    assert at is not None and (at.requested, at.pinned) == ("mcp-server-fetch==2025.1.1", "2025.1.1")
    latest = plan_launch("uvx", ["mcp-server-fetch@latest"])
    assert latest is not None and (latest.requested, latest.pinned) == ("mcp-server-fetch", None)
    source = plan_launch("uvx", ["--from", "mcp-server-git==2026.1.1", "mcp-server-git", "--repository", "/r"])
    assert source is not None
    assert (source.package, source.pinned, source.bin, source.args) == (
        "mcp-server-git", "2026.1.1", "mcp-server-git", ("--repository", "/r"))
    extras = plan_launch("uvx", ["--with", "tzdata", "mcp-server-time[cli]>=2025"])
    assert extras is not None and extras.extras == ("tzdata",) and extras.package == "mcp-server-time"
    assert extras.key == "mcp-server-time[cli]>=2025 tzdata"


def test_options_that_change_what_is_installed_are_part_of_the_request() -> None:
    python = plan_launch("uvx", ["-p", "3.11", "--with", "mcp<2", "mcp-server-sqlite", "--db-path", "x.db"])
    assert python is not None and (python.python, python.extras, python.args) == ("3.11", ("mcp<2",), ("--db-path", "x.db"))
    assert python.key == "mcp-server-sqlite mcp<2 --python 3.11"
    pipx = plan_launch("pipx", ["run", "--python=python3.11", "mcp-server-time"])
    assert pipx is not None and pipx.python == "python3.11" and pipx.key == "mcp-server-time --python python3.11"
    # several --package options are all installed; the program is looked up among them all
    several = plan_launch("npx", ["-y", "-p", "@acme/tools@3.0.0", "--package", "helper@^1", "acme-mcp", "serve"])
    assert several is not None
    assert (several.package, several.extras, several.bin, several.args) == (
        "@acme/tools", ("helper@^1",), "acme-mcp", ("serve",))
    assert several.key == "@acme/tools@3.0.0 helper@^1"


def test_pipx_run() -> None:
    plan = plan_launch("pipx", ["run", "--spec", "mcp-server-time==2026.10.19", "mcp-server-time", "--x"])
    assert plan is not None
    assert (plan.launcher, plan.package, plan.pinned, plan.bin, plan.args) == (
        "pipx", "mcp-server-time", "2026.10.19", "mcp-server-time", ("--x",))
    assert plan_launch("pipx", ["install", "x"]) is None


def test_other_commands_are_not_launchers() -> None:
    assert plan_launch("node", ["server.js"]) is None
    assert plan_launch("/opt/bin/mcp-server-git", []) is None
    assert plan_launch("uv", ["run", "server.py"]) is None


@pytest.mark.parametrize("command, args, said", [
    ("npx", ["-c", "echo hi"], "'-c'"),
    ("npx", ["-y"], "no package"),
    ("npx", ["github:user/repo"], "not an npm registry package"),
    ("npx", ["./local.tgz"], "not an npm registry package"),
    ("uvx", ["--with-requirements", "req.txt", "pkg"], "--with-requirements reads a requirements file"),
    ("uvx", ["--with-requirements=req.txt", "pkg"], "name the packages with --with"),
    ("uvx", ["--with-editable", ".", "pkg"], "--with-editable installs a local working tree"),
    ("pipx", ["run", "--pip-args=--pre", "pkg"], "--pip-args"),
    ("npx", ["-p", "@acme/tools", "-p", "github:user/repo", "acme"], "not an npm registry package"),
    ("uvx", ["git+https://example.invalid/x"], "not a PyPI package"),
    ("npx", ["--package"], "needs a value"),
])
def test_forms_bastion_cannot_run_are_refused_with_the_part(command: str, args: list[str], said: str) -> None:
    with pytest.raises(NotALauncher, match=said):
        plan_launch(command, args)
