"""What the console shows and acts on, read where the CLI reads it: the running gateways' status files
(``bastion/running.py``), the pins file, the approval queue and the audit trail, all on disk. ``bastion console``
is a process apart from the gateways a client started, so the disk is all it has; ``bastion serve --http`` reads
the same files (its own status file only), so both deployments show one thing one way. Every read blocks on the
disk: pages call these on a worker thread (``asyncio.to_thread``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.running import RunningGateway, ask_retry, running_gateways


@dataclass(frozen=True)
class ConsoleData:
    """``config``: the configuration the console was started with (its pins file, approval queue, audit trail);
    ``only_pid``: the one gateway to show (``bastion serve --http`` shows itself), None for every running one."""

    config: Any  # bastion.config.GatewayConfig
    only_pid: int | None = None
    running_dir: Path | None = None

    def gateways(self) -> list[RunningGateway]:
        found = running_gateways(self.running_dir)
        return [g for g in found if self.only_pid is None or g.pid == self.only_pid]

    def retry(self, server: str) -> list[int]:
        """Ask every shown gateway with a failed ``server`` to start it again; the pids asked (empty: none has
        such a failed server)."""
        asked = []
        for gateway in self.gateways():
            entry = gateway.servers.get(server)
            if isinstance(entry, dict) and entry.get("status") == "failed":
                ask_retry(gateway, server)
                asked.append(gateway.pid)
        return asked
