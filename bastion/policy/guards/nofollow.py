"""Whether a path crosses a symbolic link, asked of the kernel in one system call.

Linux's ``openat2`` with ``RESOLVE_NO_SYMLINKS`` walks a path and fails with ``ELOOP`` at the first
symbolic link it meets, or with ``ENOENT`` at the first missing component. Either way it has looked
at every existing component before that point, which is exactly what a component-by-component
``lstat`` walk would learn, at the cost of one system call instead of one per directory level (and,
on the missing-file path, no Python exception). System calls cost microseconds on virtual machines,
and the path guard runs on every call.

Python has no binding for ``openat2``, so it is called through ``ctypes``' ``syscall``; where it is
not available (another OS, a kernel before 5.6, a seccomp filter that refuses it) the answer is
"unknown" and the caller walks with ``lstat`` as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys
from typing import Callable

_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}  # the same number on every 64-bit Linux ABI
_AT_FDCWD = -100
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
# Reached every existing component without meeting a link: the path ends at a missing name, or
# runs through a non-directory, or names an existing file.
_NO_LINK_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR})

NO_LINK = True
LINK = False


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _openat2_probe() -> Callable[[str], bool | None] | None:
    """A function answering NO_LINK, LINK or None (cannot tell) for an absolute path, or None."""
    number = _SYS_OPENAT2.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    # Arguments made once as ctypes objects: converting Python ints through argtypes on every call
    # costs more than the system call's own user-space work.
    args = (ctypes.c_long(number), ctypes.c_long(_AT_FDCWD))
    how_pointer, how_size = ctypes.c_void_p(ctypes.addressof(how)), ctypes.c_size_t(ctypes.sizeof(how))
    get_errno, close = ctypes.get_errno, os.close

    def probe(path: str) -> bool | None:
        if "\x00" in path:
            return None
        descriptor = syscall(*args, path.encode("utf-8", "surrogateescape"), how_pointer, how_size)
        if descriptor >= 0:
            close(descriptor)
            return NO_LINK
        code = get_errno()
        if code in _NO_LINK_ERRNOS:
            return NO_LINK
        return LINK if code == errno.ELOOP else None

    probe.keep_alive = how  # type: ignore[attr-defined]  # the pointer above points into it
    if probe("/") is not NO_LINK:  # refused by seccomp, missing from the kernel: use lstat
        return None
    return probe


symlink_free = _openat2_probe()
"""``symlink_free(path)``: NO_LINK when no component of the absolute ``path`` that exists is a
symbolic link, LINK when one is, None when the kernel could not tell. None itself where openat2 is
unavailable."""
