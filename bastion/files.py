"""Files Bastion's stores share between processes (pins, API keys, credentials): an exclusive lock for a
read-change-write, and a replace that a reader never sees half written. Imports nothing else of Bastion, so every
layer may use it."""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


@contextmanager
def exclusive_lock(lock_path: Path, cannot: Callable[[OSError], Exception] | None = None) -> Iterator[None]:
    """Hold ``lock_path``'s exclusive lock (the file is made 0600, its folder 0700, if missing). When the lock file
    cannot be made, raises ``cannot(the OSError)`` (the store's own error, which names its setting), or the OSError."""
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        handle = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        if cannot is None:
            raise
        raise cannot(exc) from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing releases the lock


def replace_atomically(path: Path, data: bytes) -> os.stat_result:
    """Write ``data`` to a 0600 file beside ``path``, flushed to disk, and rename it over ``path``; its stat after.
    Raises OSError; the temporary file is gone whatever happens."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mkstemp makes it 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    return os.stat(path)


def file_signature(path: Path) -> tuple[int, int, int] | None:
    """What changes whenever ``path`` is replaced (inode, size, modification time), None when it is absent: a
    reader compares it to know whether to read again. Raises OSError when the file cannot be looked at."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
