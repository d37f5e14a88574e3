"""Python function calls per secured ``tools/call``: what one call costs in the gateway's own Python, counted with
cProfile (a count, not a time: it does not drift with the machine's load).

``bastion run`` federates the echo server from a plain ``mcpServers`` file, as users run it: the default policy
with its audit trail and the default guardrails (the client file's ``autoApprove`` lets echo run without asking).
After the handshake and a warm-up the profiler is switched on, N calls are made one after another, and it is
switched off: the count is every call the profiler saw divided by N (the gateway's main thread; the audit sealer's
thread is not on the call's path). The same with policy and guardrails off, for the shortest path.

Usage: .venv/bin/python bench/call_count.py [--calls N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dataplane import ECHO_SERVER  # noqa: E402
from dataplane_client import McpPipeClient  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
PROFILED = BENCH_DIR / "fixtures" / "profiled_bastion.py"
PROFILE_ON, PROFILE_OFF = signal.SIGRTMIN + 1, signal.SIGRTMIN + 2  # as PROFILED handles them
TARGET_CALLS_PER_SECURED_CALL = 150  # issue 27
WARM_UP = 50


def config(workdir: Path, secured: bool) -> Path:
    servers = {"echo": {"command": sys.executable, "args": [str(ECHO_SERVER)], "autoApprove": ["echo"]}}
    body: dict = {"mcpServers": servers}
    if not secured:
        body.update({"policy": "off", "guardrails": "off"})
    path = workdir / ("secured.json" if secured else "off.json")
    path.write_bytes(orjson.dumps(body))
    return path


async def count(workdir: Path, secured: bool, calls: int) -> float:
    out = workdir / ("secured.prof" if secured else "off.prof")
    env = {**os.environ, "BASTION_PROFILE_OUT": str(out), "XDG_STATE_HOME": str(workdir / "state")}
    with (workdir / "stderr.log").open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(PROFILED), str(config(workdir, secured)), stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)
        client = McpPipeClient(process)
        try:
            await client.handshake()
            tool = next(name for name in await client.tool_names() if name.endswith("echo"))
            for _ in range(WARM_UP):
                await client.timed_echo(tool, "warm")
            process.send_signal(PROFILE_ON)
            await client.request("ping")  # the signal is handled before this is answered
            for index in range(calls):
                await client.timed_echo(tool, f"call {index}")
            process.send_signal(PROFILE_OFF)
            await client.request("ping")
        finally:
            process.stdin.close()
            await asyncio.wait_for(process.wait(), 60)
    stats = pstats.Stats(str(out))
    # The two pings between the signals are counted too: each costs less than a call, so this errs high.
    return stats.total_calls / calls  # type: ignore[attr-defined]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bastion-call-count-") as tmp:
        workdir = Path(tmp)
        secured = await count(workdir, True, args.calls)
        off = await count(workdir, False, args.calls)
    figures = {"calls": args.calls, "secured": round(secured, 1), "off": round(off, 1),
               "target_secured": TARGET_CALLS_PER_SECURED_CALL, "met": secured <= TARGET_CALLS_PER_SECURED_CALL}
    if args.json:
        print(orjson.dumps(figures).decode())
        return
    print(f"Python function calls per tools/call over stdio ({args.calls} calls, cProfile):")
    print(f"  default policy and guardrails: {secured:7.1f}   target <= {TARGET_CALLS_PER_SECURED_CALL}: "
          f"{'met' if figures['met'] else 'NOT met'}")
    print(f"  policy and guardrails off:     {off:7.1f}")


if __name__ == "__main__":
    asyncio.run(main())
