"""The system-call filter every sandboxed server runs under, compiled to BPF with libseccomp.

A deny list on top of bwrap's namespaces and dropped capabilities: it closes the kernel interfaces
that have been the usual way out of containers, or that a tool server never needs. bwrap loads the
program just before it executes the server (``bwrap --seccomp FD``).
"""

from __future__ import annotations

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


def _deny(number: int) -> int:
    import pyseccomp

    return pyseccomp.ERRNO(number)


def build_filter(network: bool):  # -> pyseccomp.SyscallFilter
    """The filter for one sandbox; ``network`` allows AF_INET/AF_INET6 for the loopback proxy hop."""
    import pyseccomp as sc

    filt = sc.SyscallFilter(sc.ALLOW)
    # Anything that is not native x86-64/aarch64 (i386 int 0x80, x32) skips the rules below: refuse it.
    filt.set_attr(sc.Attr.ACT_BADARCH, _deny(errno.ENOSYS))
    for names in DENIED_SYSCALLS.values():
        for name in names:
            filt.add_rule(_deny(errno.EPERM), name)
    for flag in NAMESPACE_FLAGS.values():
        filt.add_rule(_deny(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes libc fall back to clone.
    filt.add_rule(_deny(errno.ENOSYS), "clone3")
    for request in (TIOCSTI, TIOCLINUX):
        # The kernel reads the request as 32 bits: compare only those so high bits cannot slip past.
        filt.add_rule(_deny(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    allowed_families = (AF_UNIX, AF_INET, AF_INET6) if network else (AF_UNIX,)
    for syscall in ("socket", "socketpair"):
        for denied in _denied_ranges(allowed_families):
            filt.add_rule(_deny(errno.EAFNOSUPPORT), syscall, *denied)
    return filt


def _denied_ranges(allowed: tuple[int, ...]):
    """Argument comparisons covering every socket family except ``allowed`` (libseccomp ANDs within a rule)."""
    import pyseccomp as sc

    highest = max(allowed)
    rules = [(sc.Arg(0, sc.GT, highest),)]
    rules.extend((sc.Arg(0, sc.EQ, family),) for family in range(0, highest) if family not in allowed)
    return rules


@functools.lru_cache(maxsize=2)
def compiled_bpf(network: bool) -> bytes:
    """BPF program bytes, compiled once per network mode: the filter depends on nothing else."""
    with tempfile.TemporaryFile() as out:
        build_filter(network).export_bpf(out)
        out.seek(0)
        return out.read()


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
        import pyseccomp

        compiled_bpf(False)
        return True, f"libseccomp via pyseccomp {pyseccomp.__version__}"
    except Exception as error:  # ImportError, missing libseccomp.so, unsupported arch
        return False, f"{type(error).__name__}: {error}"
