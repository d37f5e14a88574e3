"""How the gateway starts a local server's process, the ``launch`` it gives the stdio transport: the package of a
launcher (npx, uvx, ...) installed beforehand, outside the sandbox, then the server spawned through the sandbox."""

from __future__ import annotations

from bastion.config import ServerConfig
from bastion.launchers.prepare import prepare
from bastion.sandbox import spawn
from bastion.transport.upstream import ServerProcess


async def launch_server(name: str, config: ServerConfig) -> ServerProcess:
    """Every local server starts through the sandbox package, confined unless its configuration says "none".

    A server started by a package launcher (npx, uvx, ...) runs its package installed beforehand, outside the sandbox.
    """
    config = await prepare(name, config)
    return await spawn(name, config.command, config.args, config.env, config.cwd, config.sandbox)
