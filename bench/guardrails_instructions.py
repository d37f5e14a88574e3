"""Instructions per tools/call that each content guardrail adds, counted by valgrind rather than timed.

A busy machine moves wall and CPU times by tens of microseconds; an instruction count moves by about 1 % between
identical runs. For each configuration, ``bastion run`` (policy off, as in bench/guardrails.py) runs under
``valgrind --tool=cachegrind`` in front of bench/fixtures/sized_server.py, and is sent a fixed workload twice: a
short run and a long run of sequential calls. The difference of their counts divided by the difference of their
calls is the count per call, so start-up (loading the rules, the handshake) cancels out. Configurations: every
guardrail off, every one on (as it comes), and each guardrail alone.

Bastion runs from a snapshot of one commit (``git archive``, ``--commit``, default HEAD) with a bytecode cache of
its own, compiled before the measured runs: in a checkout being edited, a module compiled again in one run and
not in the other would count millions of instructions that have nothing to do with the calls.

Usage: .venv/bin/python bench/guardrails_instructions.py [--commit REV] [--size N] [--calls SHORT,LONG]
       [--only off,on,...]
Slow: each configuration runs Bastion twice under valgrind (about half a minute each on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane_client import McpPipeClient  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SIZED_SERVER = BENCH_DIR / "fixtures" / "sized_server.py"
GUARDRAILS = ("pinning", "metadata_injection", "deputy", "taint", "sampling", "output_injection", "secrets")
OFF = {name: "off" for name in (*GUARDRAILS, "pii")}


def configurations() -> dict[str, Any]:
    configs: dict[str, Any] = {"off": "off", "on": None}
    for name in GUARDRAILS:
        alone = dict(OFF)
        alone[name] = "redact" if name == "secrets" else {"pinning": "enforce", "metadata_injection": "withhold",
                                                           "deputy": "enforce", "taint": "approve",
                                                           "sampling": "enforce", "output_injection": "mark"}[name]
        if name == "secrets":
            alone["pii"] = "redact"
        configs["secrets+pii" if name == "secrets" else name] = alone
    return configs


async def until_idle(client: McpPipeClient) -> None:
    """Wait until the gateway's work of starting (rules loaded in a thread, a search index built) is done, so that
    the short and the long run start their calls from the same state and only the calls differ."""
    previous = client.cpu_seconds() or 0.0
    quiet = 0
    while quiet < 3:
        await asyncio.sleep(0.5)
        now = client.cpu_seconds() or 0.0
        quiet = quiet + 1 if now - previous < 0.02 else 0
        previous = now


async def count(python: str, config: Path, size: int, calls: int, workdir: Path, label: str) -> int:
    out = workdir / f"{label}-{calls}.cg"
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--branch-sim=no", f"--cachegrind-out-file={out}",
            python, "-m", "bastion", "run", str(config)]
    # A state folder per run: each pins the server's tools on first sight, as the other does.
    env = {**environment(workdir), "XDG_STATE_HOME": str(workdir / f"state-{label}-{calls}")}
    with open(workdir / f"{label}-{calls}.log", "wb") as log:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, limit=1 << 25,
            cwd=workdir / "tree", env=env, start_new_session=True)
        client = McpPipeClient(process)
        try:
            await asyncio.wait_for(client.handshake(), 600)
            (tool,) = [name for name in await client.tool_names() if name.endswith("read")]
            await until_idle(client)
            for _ in range(calls):
                await client.request("tools/call", {"name": tool, "arguments": {"size": size}})
        finally:
            await client.close(grace_seconds=120)
    summary = re.search(rb"^summary:\s+(\d+)", out.read_bytes(), re.MULTILINE)
    if summary is None:
        raise RuntimeError(f"no cachegrind summary for {label}")
    return int(summary.group(1))


def snapshot(commit: str, workdir: Path) -> Path:
    """The tree of ``commit`` in ``workdir``, so that edits to the checkout during the runs change nothing."""
    tree = workdir / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", commit], cwd=REPO_ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def environment(workdir: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(workdir / "state"), "XDG_CACHE_HOME": str(workdir / "cache"),
            "PYTHONPYCACHEPREFIX": str(workdir / "pycache"), "PYTHONPATH": str(workdir / "tree")}


def prime(python: str, workdir: Path) -> None:
    """Compile the snapshot's modules and the guardrails' Hyperscan databases first, so that every measured run
    loads them rather than the first one compiling them."""
    code = ("import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=1); "
            "from bastion.guardrails.scanning import default_scanner; from bastion.guardrails.injection import _matcher; "
            "default_scanner(); _matcher()")
    subprocess.run([python, "-c", code, str(workdir / "tree" / "bastion")], check=True, cwd=workdir / "tree",
                   env=environment(workdir))


async def measure(options: argparse.Namespace, workdir: Path) -> dict[str, float]:
    short, long = options.calls
    snapshot(options.commit, workdir)
    prime(options.python, workdir)
    per_call: dict[str, float] = {}
    for label, guardrails in configurations().items():
        if options.only and label not in options.only:
            continue
        # Under valgrind Bastion and its server start slowly: the first list must wait for the server, not time out.
        top: dict[str, Any] = {"policy": "off", "ready_timeout": 600,
                               "servers": {"sized": {"command": options.python, "args": [str(SIZED_SERVER)]}}}
        if guardrails is not None:
            top["guardrails"] = guardrails
        config = workdir / f"{label}.json"
        config.write_bytes(orjson.dumps(top))
        few = await count(options.python, config, options.size, short, workdir, label)
        many = await count(options.python, config, options.size, long, workdir, label)
        per_call[label] = (many - few) / (long - short)
        print(f"{label:>20}: {per_call[label]:>12,.0f} instructions per call", file=sys.stderr, flush=True)
    return per_call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="the commit to measure (HEAD)")
    parser.add_argument("--size", type=int, default=200, help="characters per answer (200)")
    parser.add_argument("--calls", default="100,600", help="calls of the short and the long run (100,600)")
    parser.add_argument("--only", default="", help="comma-separated configurations (off,on,pinning,...)")
    parser.add_argument("--python", default=sys.executable)
    options = parser.parse_args(argv)
    options.calls = tuple(int(part) for part in options.calls.split(","))
    options.only = set(filter(None, options.only.split(",")))
    with tempfile.TemporaryDirectory(prefix="bastion-bench-instructions-") as workdir:
        per_call = asyncio.run(measure(options, Path(workdir)))
    base = per_call.get("off")
    print("| configuration | instructions per call | added to off |\n|---|---:|---:|")
    for label, value in per_call.items():
        added = f"{value - base:,.0f}" if base is not None else "-"
        print(f"| {label} | {value:,.0f} | {added} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
