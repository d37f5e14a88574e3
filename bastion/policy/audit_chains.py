"""The chains of one audit trail, so that several Bastion processes can write it at once.

A hash chain has one writer: two processes appending to one file would interleave two chains, and the
file would no longer verify. So each chain has a lock, ``<chain file>.lock`` beside it (an exclusive
``flock`` held by the gateway and passed to its sealer, so it lasts while either lives), and a process
writes the first chain whose lock it gets:

- chain 0 is the configured path, ``audit.jsonl``, as for a single process;
- chain N is ``audit.chain-N.jsonl`` beside it, taken by a process that finds chains 0..N-1 busy.

Every chain is continued by the next process that takes it and rotates as the main one does
(``audit.chain-N.<first seq>.jsonl``), so there are at most as many chains as processes that ever ran at
once. When chain N (N ≥ 1) is first made it is entered in the trail's registry, ``audit.chains.jsonl``, a
hash chain itself, and its first record (``"kind": "chain"``) names it: a chain whose files were deleted
is missing from where the registry says it is, and one whose files were put in place of another's names the
wrong chain.

This module names, finds and claims chains; ``audit`` writes and verifies them.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bastion.policy.audit_sealer import GENESIS, _last_record, sealed_line, trail_files

MAX_CHAINS = 1000  # chains one trail may have: more processes than this at once is a runaway, not a workload
CHAIN_KIND = "chain"  # the first record of chain N ≥ 1
REGISTERED_KIND = "registered"  # a registry record: chain N was made
_REGISTRY_WAIT_SECONDS = 10.0
_ROTATED = r"\.(?P<rotated>\d{12,})"
_CHAIN = r"\.chain-(?P<chain>[1-9]\d*)"


class TrailUnavailable(Exception):
    """No chain of the trail can be written; the message names the file and the fix."""


def _suffix(main: Path) -> str:
    return main.suffix or ".jsonl"


def chain_path(main: Path, index: int) -> Path:
    """The current file of chain ``index`` of the trail whose configured path is ``main``."""
    if index == 0:
        return main
    return main.with_name(f"{main.stem}.chain-{index}{_suffix(main)}")


def lock_path(chain: Path) -> Path:
    return chain.with_name(chain.name + ".lock")


def registry_path(main: Path) -> Path:
    """Where the trail records each chain beside the main one when it is first made."""
    return main.with_name(f"{main.stem}.chains{_suffix(main)}")


@dataclass(frozen=True)
class ChainFile:
    """What a file's name says it is: which trail (its configured path), which chain, whether rotated."""

    main: Path
    chain: int
    rotated: bool


def parse_name(path: Path) -> ChainFile:
    """Read a trail file's name; a name with neither marker is a configured path, chain 0's current file."""
    suffix = path.suffix or ".jsonl"
    match = re.fullmatch(rf"(?P<stem>.+?)(?:{_CHAIN})?(?:{_ROTATED})?{re.escape(suffix)}", path.name)
    if match is None or not (match["chain"] or match["rotated"]):
        return ChainFile(path, 0, False)
    return ChainFile(path.with_name(match["stem"] + suffix), int(match["chain"] or 0), bool(match["rotated"]))


def trail_chains(main: Path) -> dict[int, list[Path]]:
    """Every chain of the trail found on disk, by index: each chain's rotated files, oldest first, then its current one.

    Chain 0 is listed even when none of its files exist (it is what the trail's path names).
    """
    chains: dict[int, list[Path]] = {0: trail_files(main)}
    for candidate in main.parent.glob(f"{main.stem}.chain-*{_suffix(main)}"):
        found = parse_name(candidate)
        if found.chain and found.main == main and found.chain not in chains:
            chains[found.chain] = trail_files(chain_path(main, found.chain))
    return dict(sorted(chains.items()))


def registered_chains(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The registry's records by the chain they made."""
    out: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.get("kind") == REGISTERED_KIND and type(record.get("chain")) is int:
            out.setdefault(record["chain"], record)
    return out


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a small trail file (the registry), skipping lines that are not."""
    records = []
    for line in path.read_bytes().splitlines():
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if type(record) is dict:
            records.append(record)
    return records


def chain_in_use(chain: Path) -> bool | None:
    """Whether a process holds the chain's lock now (None: no lock file, or it cannot be read)."""
    try:
        fd = os.open(lock_path(chain), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)  # closing also releases a lock taken just now
    return False


@dataclass
class ClaimedChain:
    """A chain this process writes, and the open lock file that keeps it this process's alone."""

    index: int
    path: Path
    lock_fd: int
    fresh: bool  # it holds no record yet: for chain N ≥ 1, its opening record comes first

    def release(self) -> None:
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def opening_record(index: int) -> dict[str, Any]:
    """The first record of chain ``index`` ≥ 1, naming the chain its records belong to."""
    return {"kind": CHAIN_KIND, "chain": index, "pid": os.getpid(), "ts": time.time()}


def claim_chain(main: Path, key: bytes | None, max_chains: int = MAX_CHAINS) -> ClaimedChain:
    """Lock the first free chain of the trail, make its file, and register it if it is new.

    Raises TrailUnavailable when no chain can be locked or its file cannot be written.
    """
    for index in range(max_chains + 1):
        path = chain_path(main, index)
        fd = _try_lock(lock_path(path))
        if fd is None:
            continue
        try:
            _open_chain_file(path)
            if index:
                _register(main, index, key)
            fresh = all(_last_record(member) is None for member in trail_files(path))
        except BaseException:
            os.close(fd)
            raise
        return ClaimedChain(index, path, fd, fresh)
    raise TrailUnavailable(
        f"{main}: {max_chains + 1} Bastion processes are writing this audit trail already (each holds one of "
        f"its chains); end some of them, or give the others their own audit.path"
    )


def _try_lock(path: Path) -> int | None:
    """The lock file's descriptor, locked exclusively; None when another process holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise TrailUnavailable(
            f"{path}: cannot open the audit trail's lock ({error.strerror}); fix its permissions or set audit.path"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as error:
        os.close(fd)
        raise TrailUnavailable(
            f"{path}: cannot lock the audit trail ({error.strerror}): its file system does not support locks; "
            f"set audit.path to a local directory"
        ) from None
    return fd


def _open_chain_file(path: Path) -> None:
    try:
        # Made here, before the sealer starts, so that a trail that cannot be written stops the start.
        with path.open("ab"):
            os.chmod(path, 0o600)
    except OSError as error:
        raise TrailUnavailable(
            f"{path}: cannot open the audit trail ({error.strerror}); fix its permissions or set audit.path"
        ) from None


def _register(main: Path, index: int, key: bytes | None) -> None:
    """Enter chain ``index`` in the trail's registry, unless it is there already."""
    registry = registry_path(main)
    try:
        fd = os.open(registry, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    except OSError as error:
        raise TrailUnavailable(
            f"{registry}: cannot open the audit trail's registry of chains ({error.strerror}); fix its permissions"
        ) from None
    try:
        _lock_waiting(fd, registry)
        records = read_records(registry)
        if index in registered_chains(records):
            return
        last = records[-1] if records else None
        if last is not None and (type(last.get("seq")) is not int or type(last.get("hash")) is not str):
            raise TrailUnavailable(
                f"{registry}: its last line is not a registry record, so the registry cannot be continued; "
                f"check it with `bastion audit verify {main}`, then move it aside"
            )
        record = {
            "kind": REGISTERED_KIND,
            "chain": index,
            "file": chain_path(main, index).name,
            "pid": os.getpid(),
            "ts": time.time(),
            "seq": last["seq"] + 1 if last else 0,
            "prev": last["hash"] if last else GENESIS,
        }
        line, _ = sealed_line(record, key)
        os.write(fd, line)
        os.fsync(fd)
    except OSError as error:
        raise TrailUnavailable(f"{registry}: cannot write the audit trail's registry of chains ({error.strerror})") from None
    finally:
        os.close(fd)


def _lock_waiting(fd: int, path: Path) -> None:
    """Lock the registry, waiting for another process's brief append."""
    deadline = time.monotonic() + _REGISTRY_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TrailUnavailable(
                    f"{path}: another process has held the audit registry's lock for {_REGISTRY_WAIT_SECONDS:.0f} s"
                ) from None
            time.sleep(0.01)
        except OSError as error:
            if error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise TrailUnavailable(
                    f"{path}: cannot lock the audit registry ({error.strerror}): set audit.path to a local directory"
                ) from None
            raise
