"""What a launcher server sees of Bastion's package cache inside the sandbox: its own install tree, read-only,
and nothing else of the cache (not other packages, not Bastion's notes beside the tree)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bastion.config import ServerConfig
from bastion.launchers.prepare import prepare
from bastion.sandbox import spawn
from bastion.sandbox.engine import find_engine
from bastion.sandbox.process import plan_sandbox
from tests.launchers.test_real_launchers import MEMORY, offline_package_clients  # noqa: F401  (autouse fixture)

PROBE = """
const fs = require("fs");
const [tree, cache] = [process.env.TREE, process.env.CACHE];
const result = {};
result.listed = fs.readdirSync(tree).includes("@modelcontextprotocol");
try { fs.writeFileSync(tree + "/planted.js", "x"); result.write = "written"; } catch (e) { result.write = e.code; }
try { result.cache = fs.readdirSync(cache); } catch (e) { result.cache = e.code; }
process.stdout.write(JSON.stringify(result));
"""


@pytest.fixture
def own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state" / "bastion" / "packages"


async def test_the_install_tree_is_read_only_and_the_rest_of_the_cache_invisible(own_state: Path, tmp_path: Path) -> None:
    server = ServerConfig(command="npx", args=["-y", MEMORY])
    installed = await prepare("memory", server)
    tree = Path(installed.command).parent.parent  # .../node_modules/.bin/mcp-server-memory
    assert tree.name == "node_modules" and own_state in tree.parents
    assert installed.args == [] and str(tree) in installed.sandbox.read_only
    sibling = own_state / "npm" / "other-server@1.0.0"
    sibling.mkdir(parents=True)
    (sibling / "secret.txt").write_text("another package's file")

    plan = plan_sandbox(find_engine(), installed.command, installed.args, {}, None, installed.sandbox,
                        str(tmp_path), None)
    under_cache = {mount.dest for mount in plan.mounts if mount.dest.startswith(str(own_state))}
    assert under_cache == {str(tree)}
    assert all(mount.kind == "ro" for mount in plan.mounts if mount.dest == str(tree))

    # the paths go in the environment: paths named in arguments would be bound for the probe
    process = await spawn("probe", "node", ["-e", PROBE], {"TREE": str(tree), "CACHE": str(own_state / "npm")},
                          None, installed.sandbox)
    output = await process.stdout.read()
    assert await process.wait() == 0
    seen = json.loads(output)
    assert seen["listed"] is True
    assert seen["write"] == "EROFS"
    # only the bound tree's own folder exists on the way down to it, empty of everything else
    assert seen["cache"] == [tree.parent.name]
    assert not os.path.exists(tree / "planted.js")
