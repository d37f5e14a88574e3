"""Starting a local server process with its stdio as pipes."""

from __future__ import annotations

import asyncio
import os
import signal

from bastion.config import ServerConfig

STREAM_LIMIT = 64 * 1024 * 1024


class PlainProcess:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.stderr = process.stderr
        self.pid = process.pid

    async def wait(self) -> int:
        return await self._process.wait()

    def termination_reason(self) -> str | None:
        code = self._process.returncode
        if code is not None and code < 0:
            return f"killed by signal {-code}"
        return None

    async def terminate(self, grace: float = 2.0) -> None:
        process = self._process
        if process.returncode is None:
            try:
                process.stdin.close()
            except Exception:  # noqa: BLE001
                pass
            for sig in (None, signal.SIGTERM, signal.SIGKILL):
                if sig is not None:
                    try:
                        os.killpg(process.pid, sig)
                    except ProcessLookupError:
                        break
                try:
                    await asyncio.wait_for(process.wait(), grace)
                    break
                except asyncio.TimeoutError:
                    continue
        else:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


async def spawn_plain(name: str, config: ServerConfig) -> PlainProcess:
    env = {**os.environ, **config.env}
    process = await asyncio.create_subprocess_exec(
        config.command, *config.args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=config.cwd, limit=STREAM_LIMIT, start_new_session=True,
    )
    return PlainProcess(process)
