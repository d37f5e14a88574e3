"""What the console shows and acts on, read where the CLI reads it: the running gateways' status files
(``bastion/running.py``), the pins file, the approval queue and the audit trail, all on disk. ``bastion console``
is a process apart from the gateways a client started, so the disk is all it has; ``bastion serve --http`` reads
the same files (its own status file only), so both deployments show one thing one way. Every read blocks on the
disk: pages call these on a worker thread (``asyncio.to_thread``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bastion.console.live import LiveWindow
from bastion.policy.approval import ApprovalQueue
from bastion.policy.config import ApprovalConfig
from bastion.running import RunningGateway, ask_retry, running_gateways


@dataclass(frozen=True)
class ConsoleData:
    """``config``: the configuration the console was started with (its pins file, approval queue, audit trail);
    ``only_pid``: the one gateway to show (``bastion serve --http`` shows itself), None for every running one."""

    config: Any  # bastion.config.GatewayConfig
    only_pid: int | None = None
    running_dir: Path | None = None
    # The live figures over the gateway's own metrics: only the console inside the gateway (serve --http) has them.
    live: LiveWindow | None = None

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

    def approval_queue(self) -> ApprovalQueue:
        """The queue the gateways of this configuration wait on (``policy.approval.queue_dir``)."""
        policy = self.config.policy
        return ApprovalQueue(policy.approval.queue_dir if policy is not None else ApprovalConfig().queue_dir)

    def audit_trail(self) -> str | None:
        """The trail this configuration writes (``policy.audit.path``), None when it writes none."""
        policy = self.config.policy
        return policy.audit.path if policy is not None and policy.audit.enabled else None

    def audit_key(self) -> bytes | None:
        """The trail's HMAC key (``policy.audit.key_file``), None without one or when it cannot be read: the trail
        then reads as altered, which is what the page says of it (a key is never made here)."""
        policy = self.config.policy
        path = policy.audit.key_file if policy is not None else None
        if not path:
            return None
        try:
            return bytes.fromhex(Path(path).expanduser().read_text().strip())
        except (OSError, ValueError):
            return None

    def live_window(self) -> LiveWindow | None:
        return self.live
