"""Start-up of a stock client file of npx servers: ``bastion run`` -> first complete tools/list, against the same
servers started directly, in one run.

The file is what Claude Desktop users have: ``npx -y`` servers filesystem, memory and everything, no policy
section (so the default policy and the audit trail are on). Bastion installs the packages once (offline, from
npm's cache that scripts/setup.sh fills) before anything is timed; every timed start then runs the installed,
locked packages inside the default sandbox. The direct path starts the same installed programs as plain
processes, no Bastion and no sandbox, and asks each for its tools at once. Rounds alternate between the paths,
so the machine's load lands on both alike; only the ratio within one run means anything.

Timed from spawning the process(es) to the first tools/list that holds every server's tools: through Bastion
the client sends initialize, then tools/list, and again after each notifications/tools/list_changed until all
three servers' tools are in.

Target: Bastion's median <= 1.3 x the direct median.

Usage: .venv/bin/python bench/launcher_startup.py [--rounds N (10)] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_RATIO = 1.3
SERVERS = {
    "filesystem": "@modelcontextprotocol/server-filesystem",
    "memory": "@modelcontextprotocol/server-memory",
    "everything": "@modelcontextprotocol/server-everything",
}
ANSWER_TIMEOUT_S = 120.0
CLIENT_INFO = {"name": "launcher-bench", "version": "0"}


def stock_file(folder: Path) -> Path:
    data = folder / "data"
    data.mkdir(exist_ok=True)
    servers = {name: {"command": "npx", "args": ["-y", package, *([str(data)] if name == "filesystem" else [])]}
               for name, package in SERVERS.items()}
    path = folder / "claude_desktop_config.json"
    # Every tool listed: start-up is timed to the first list that holds every server's tools (past 10 tools the
    # default exposure would list the search meta-tools instead).
    path.write_text(json.dumps({"mcpServers": servers, "tools": {"exposure": "all"}}, indent=2))
    return path


class Peer:
    """One JSON-RPC peer over a subprocess's pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.notifications: asyncio.Queue[dict] = asyncio.Queue()
        self._waiting: dict[int, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())
        self._next_id = 0

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            if "method" in message:
                if "id" not in message:
                    await self.notifications.put(message)
                continue
            waiter = self._waiting.pop(message.get("id"), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
        for waiter in self._waiting.values():
            if not waiter.done():
                waiter.set_exception(RuntimeError(f"the process exited (status {self.process.returncode})"))

    def send(self, message: dict) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")

    async def request(self, method: str, params: dict) -> dict:
        self._next_id += 1
        waiter = asyncio.get_running_loop().create_future()
        self._waiting[self._next_id] = waiter
        self.send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        answer = await asyncio.wait_for(waiter, ANSWER_TIMEOUT_S)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer["result"]

    async def initialize(self) -> dict:
        result = await self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                   "clientInfo": CLIENT_INFO})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return result

    async def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 20)
        except asyncio.TimeoutError:
            self.process.kill()
            await self.process.wait()
        self._reader.cancel()


async def through_bastion(config: Path, env: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bastion", "run", str(config), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
    peer = Peer(process)
    try:
        await peer.initialize()
        while True:
            tools = (await peer.request("tools/list", {}))["tools"]
            if {tool["name"].split("__", 1)[0] for tool in tools} >= set(SERVERS):
                return time.perf_counter() - started, len(tools)
            while True:  # a server that comes later joins with list_changed
                note = await asyncio.wait_for(peer.notifications.get(), ANSWER_TIMEOUT_S)
                if note["method"] == "notifications/tools/list_changed":
                    break
    finally:
        await peer.close()


async def directly(programs: dict[str, tuple[str, list[str]]], env: dict[str, str]) -> tuple[float, int]:
    """All servers spawned at once; the clock stops when the last has answered tools/list (closing is not start-up)."""
    started = time.perf_counter()
    answered: list[float] = []

    async def one(command: str, args: list[str]) -> int:
        process = await asyncio.create_subprocess_exec(
            command, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=env)
        peer = Peer(process)
        try:
            await peer.initialize()
            count = len((await peer.request("tools/list", {}))["tools"])
            answered.append(time.perf_counter() - started)
            return count
        finally:
            await peer.close()

    counts = await asyncio.gather(*(one(command, args) for command, args in programs.values()))
    return max(answered), sum(counts)


def lock_file_of(config: Path) -> Path | None:
    """Where Bastion keeps the lock of this client-format file: in its state directory, not beside the file."""
    from bastion.config import load_config
    from bastion.launchers.prepare import config_lock_path

    return config_lock_path(load_config(config, log_notes=False))


async def installed_programs(config: Path) -> dict[str, tuple[str, list[str]]]:
    """Each server's installed program and arguments, as Bastion runs it (installing it first when needed)."""
    from bastion.config import load_config
    from bastion.launchers.prepare import prepare

    loaded = load_config(config)
    programs = {}
    for name, server in loaded.servers.items():
        prepared = await prepare(name, server)
        programs[name] = (prepared.command, prepared.args)
    return programs


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered) * 1000, "p90_ms": ordered[math.ceil(0.9 * len(ordered)) - 1] * 1000,
            "min_ms": ordered[0] * 1000}


async def measure(rounds: int, folder: Path) -> dict:
    env = {**os.environ, "XDG_STATE_HOME": str(folder / "state"), "npm_config_offline": "true"}
    os.environ.update({"XDG_STATE_HOME": env["XDG_STATE_HOME"], "npm_config_offline": "true"})
    config = stock_file(folder)
    programs = await installed_programs(config)
    # Untimed: Bastion's first start writes the lock file; both paths warm the page cache alike.
    _, bastion_tools = await through_bastion(config, env)
    _, direct_tools = await directly(programs, env)
    samples: dict[str, list[float]] = {"direct": [], "bastion": []}
    for round_number in range(rounds):
        order = ["direct", "bastion"] if round_number % 2 == 0 else ["bastion", "direct"]
        for path in order:
            elapsed, _ = await (directly(programs, env) if path == "direct" else through_bastion(config, env))
            samples[path].append(elapsed)
    report = {
        "rounds": rounds,
        "servers": list(SERVERS),
        "tools": {"direct": direct_tools, "bastion": bastion_tools},
        "first_complete_tools_list": {path: summary(values) for path, values in samples.items()},
        "lock_file": str(lock_file_of(config)),
    }
    medians = report["first_complete_tools_list"]
    report["ratio"] = medians["bastion"]["median_ms"] / medians["direct"]["median_ms"]
    report["paired_ratio"] = statistics.median(b / d for b, d in zip(samples["bastion"], samples["direct"], strict=True))
    report["target_ratio"] = TARGET_RATIO
    report["meets_target"] = report["ratio"] <= TARGET_RATIO
    return report


def print_report(report: dict) -> None:
    out = sys.stderr
    print(f"stock file of {len(report['servers'])} npx servers ({', '.join(report['servers'])}), "
          f"spawn -> first complete tools/list ({report['rounds']} rounds, alternating):", file=out)
    for path, figures in report["first_complete_tools_list"].items():
        print(f"  {path:8s} median {figures['median_ms']:8.1f} ms   p90 {figures['p90_ms']:8.1f} ms   "
              f"min {figures['min_ms']:8.1f} ms   ({report['tools'][path]} tools)", file=out)
    print(f"  ratio of medians bastion / direct: {report['ratio']:.3f}x (target <= {TARGET_RATIO}x: "
          f"{'met' if report['meets_target'] else 'NOT met'})", file=out)
    print(f"  median of per-round ratios: {report['paired_ratio']:.3f}x", file=out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON on stdout")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bastion-launcher-bench-") as folder:
        report = asyncio.run(measure(args.rounds, Path(folder)))
    print_report(report)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
