"""The system-call filter every sandboxed server runs under, compiled to BPF with libseccomp.

A deny list on top of bwrap's namespaces and dropped capabilities: it closes the kernel interfaces
that have been the usual way out of containers, or that a tool server never needs. bwrap loads the
program just before it executes the server (``bwrap --seccomp FD``). libseccomp is the distribution's, called
through ctypes: no Python binding is installed for it (docs/sandbox.md says why).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import tempfile

AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10

TIOCSTI = 0x5412  # push bytes into a terminal's input queue: keystroke injection
TIOCLINUX = 0x541C  # console selection paste and friends: same effect on a virtual console

# Namespace flags accepted by clone/unshare: creating any of them is denied.
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}

DENIED_SYSCALLS: dict[str, tuple[str, ...]] = {
    "debugging other processes": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp"),
    "mounting, old and new API": (
        "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
        "fsmount", "fspick", "mount_setattr",
    ),
    "namespaces": ("unshare", "setns"),
    "kernel keyrings": ("keyctl", "add_key", "request_key"),
    "eBPF and perf": ("bpf", "perf_event_open"),
    "kernel replacement and modules": ("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
    "io_uring (bypasses this filter)": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
    "file handles (open_by_handle_at escapes)": ("open_by_handle_at", "name_to_handle_at"),
    "machine administration": (
        "reboot", "swapon", "swapoff", "syslog", "acct", "settimeofday", "clock_settime", "clock_adjtime",
        "adjtimex", "quotactl", "lookup_dcookie", "userfaultfd", "sethostname", "setdomainname",
    ),
}


# libseccomp's constants (seccomp.h), stable across its releases.
_ACT_ALLOW = 0x7FFF0000
_ATTR_ACT_BADARCH = 2
_CMP_EQ, _CMP_GT, _CMP_MASKED_EQ = 4, 6, 7


def _deny(number: int) -> int:
    return 0x00050000 | (number & 0xFFFF)  # SCMP_ACT_ERRNO(number)


class _ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp: one comparison of a system call's argument."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


def _arg(index: int, op: int, a: int, b: int = 0) -> _ArgCmp:
    return _ArgCmp(index, op, a, b)


class SeccompUnavailable(RuntimeError):
    """libseccomp cannot be loaded, or refused the filter: the message says which call and why."""


@functools.lru_cache(maxsize=1)
def _libseccomp() -> ctypes.CDLL:
    """The distribution's libseccomp (Debian's libseccomp2), bound by hand: the five calls compiling the filter
    need (and the readable listing), so no third-party binding is installed or imported for them."""
    try:
        lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    except OSError as error:
        raise SeccompUnavailable(f"libseccomp is not installed ({error}); install libseccomp2 "
                                 "(Debian/Ubuntu), libseccomp (Fedora, Arch)") from error
    lib.seccomp_init.argtypes, lib.seccomp_init.restype = (ctypes.c_uint32,), ctypes.c_void_p
    lib.seccomp_release.argtypes, lib.seccomp_release.restype = (ctypes.c_void_p,), None
    lib.seccomp_attr_set.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
    lib.seccomp_syscall_resolve_name.argtypes = (ctypes.c_char_p,)
    lib.seccomp_rule_add_array.argtypes = (ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp))
    lib.seccomp_export_bpf.argtypes = lib.seccomp_export_pfc.argtypes = (ctypes.c_void_p, ctypes.c_int)
    for name in ("seccomp_attr_set", "seccomp_syscall_resolve_name", "seccomp_rule_add_array", "seccomp_export_bpf",
                 "seccomp_export_pfc"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def libseccomp_version() -> str:
    lib = _libseccomp()

    class _Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    lib.seccomp_version.restype = ctypes.POINTER(_Version)
    found = lib.seccomp_version().contents
    return f"{found.major}.{found.minor}.{found.micro}"


class _Filter:
    """A libseccomp filter context, released when compiled."""

    def __init__(self, default_action: int) -> None:
        self._lib = _libseccomp()
        self._ctx = self._lib.seccomp_init(default_action)
        if not self._ctx:
            raise SeccompUnavailable("seccomp_init failed")

    def _check(self, call: str, result: int) -> None:
        if result < 0:  # libseccomp returns -errno
            raise SeccompUnavailable(f"{call}: {os.strerror(-result)}")

    def set_attr(self, attr: int, value: int) -> None:
        self._check("seccomp_attr_set", self._lib.seccomp_attr_set(self._ctx, attr, value))

    def add_rule(self, action: int, syscall: str, *comparisons: _ArgCmp) -> None:
        number = self._lib.seccomp_syscall_resolve_name(syscall.encode())
        if number == -1:  # __NR_SCMP_ERROR: libseccomp does not know the name on this architecture
            raise SeccompUnavailable(f"libseccomp does not know the system call {syscall!r}")
        array = (_ArgCmp * len(comparisons))(*comparisons)
        self._check(f"seccomp_rule_add_array({syscall})",
                    self._lib.seccomp_rule_add_array(self._ctx, action, number, len(comparisons), array))

    def export_bpf(self, fd: int) -> None:
        self._check("seccomp_export_bpf", self._lib.seccomp_export_bpf(self._ctx, fd))

    def export_pfc(self, fd: int) -> None:
        """The filter as libseccomp's readable listing: what a person (or a test) checks it against."""
        self._check("seccomp_export_pfc", self._lib.seccomp_export_pfc(self._ctx, fd))

    def release(self) -> None:
        if self._ctx:
            self._lib.seccomp_release(self._ctx)
            self._ctx = None


def build_filter(network: bool) -> _Filter:
    """The filter for one sandbox; ``network`` allows AF_INET/AF_INET6 for the loopback proxy hop."""
    filt = _Filter(_ACT_ALLOW)
    try:
        _add_rules(filt, network)
    except BaseException:
        filt.release()
        raise
    return filt


def _add_rules(filt: _Filter, network: bool) -> None:
    # Anything that is not native x86-64/aarch64 (i386 int 0x80, x32) skips the rules below: refuse it.
    filt.set_attr(_ATTR_ACT_BADARCH, _deny(errno.ENOSYS))
    for names in DENIED_SYSCALLS.values():
        for name in names:
            filt.add_rule(_deny(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS.values():
        filt.add_rule(_deny(errno.EPERM), "clone", _arg(0, _CMP_MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes libc fall back to clone.
    filt.add_rule(_deny(errno.ENOSYS), "clone3")
    for request in (TIOCSTI, TIOCLINUX):
        # The kernel reads the request as 32 bits: compare only those so high bits cannot slip past.
        filt.add_rule(_deny(errno.EPERM), "ioctl", _arg(1, _CMP_MASKED_EQ, 0xFFFFFFFF, request))
    allowed_families = (AF_UNIX, AF_INET, AF_INET6) if network else (AF_UNIX,)
    for syscall in ("socket", "socketpair"):
        for denied in _denied_ranges(allowed_families):
            filt.add_rule(_deny(errno.EAFNOSUPPORT), syscall, *denied)


def _denied_ranges(allowed: tuple[int, ...]) -> list[tuple[_ArgCmp, ...]]:
    """Argument comparisons covering every socket family except ``allowed`` (libseccomp ANDs within a rule)."""
    highest = max(allowed)
    rules = [(_arg(0, _CMP_GT, highest),)]
    rules.extend((_arg(0, _CMP_EQ, family),) for family in range(0, highest) if family not in allowed)
    return rules


@functools.lru_cache(maxsize=2)
def compiled_bpf(network: bool) -> bytes:
    """BPF program bytes, compiled once per network mode: the filter depends on nothing else."""
    filt = build_filter(network)
    try:
        with tempfile.TemporaryFile() as out:
            filt.export_bpf(out.fileno())
            out.seek(0)
            return out.read()
    finally:
        filt.release()


def bpf_fd(network: bool) -> int:
    """A sealed in-memory file holding the program, to pass to ``bwrap --seccomp``."""
    program = compiled_bpf(network)
    fd = os.memfd_create("bastion-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def available() -> tuple[bool, str]:
    """Whether a filter can be compiled here, and libseccomp's version or the reason it cannot."""
    try:
        compiled_bpf(False)
        return True, f"libseccomp {libseccomp_version()} (the system's, through ctypes)"
    except Exception as error:  # a missing libseccomp.so, an unsupported arch
        return False, f"{type(error).__name__}: {error}"


def oci_filter(network: bool) -> dict:
    """The same deny list as an OCI ``linux.seccomp`` section, for runsc (``--oci-seccomp``), which applies it
    inside its own kernel. Two differences, both of runsc 20221219: it answers every denied call with EPERM (it
    ignores ``errnoRet``), and clone3 is left out, since gVisor does not implement clone3 (it answers ENOSYS,
    which makes libc fall back to clone, as the host filter does on purpose) and EPERM there would break threads.
    Foreign ABIs need no rule: gVisor serves none."""
    rules: list[dict] = [{"names": [name for names in DENIED_SYSCALLS.values() for name in names],
                          "action": "SCMP_ACT_ERRNO"}]
    for flag in NAMESPACE_FLAGS.values():
        rules.append({"names": ["clone"], "action": "SCMP_ACT_ERRNO",
                      "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]})
    for request in (TIOCSTI, TIOCLINUX):
        rules.append({"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
                      "args": [{"index": 1, "value": 0xFFFFFFFF, "valueTwo": request, "op": "SCMP_CMP_MASKED_EQ"}]})
    allowed = (AF_UNIX, AF_INET, AF_INET6) if network else (AF_UNIX,)
    highest = max(allowed)
    for syscall in ("socket", "socketpair"):
        rules.append({"names": [syscall], "action": "SCMP_ACT_ERRNO",
                      "args": [{"index": 0, "value": highest, "op": "SCMP_CMP_GT"}]})
        rules += [{"names": [syscall], "action": "SCMP_ACT_ERRNO",
                   "args": [{"index": 0, "value": family, "op": "SCMP_CMP_EQ"}]}
                  for family in range(0, highest) if family not in allowed]
    return {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": rules}
