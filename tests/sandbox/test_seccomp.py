"""The seccomp filter, probed from inside a real sandbox, with the unconfined run as the control."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

import pytest

from bastion.sandbox import SandboxConfig, spawn
from bastion.sandbox.seccomp import DENIED_SYSCALLS, build_filter, compiled_bpf

PROBE = r"""
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def raw(number, *args):
    result = libc.syscall(number, *[ctypes.c_long(a) for a in args])
    return 0 if result >= 0 else ctypes.get_errno()

def family(domain):
    try:
        socket.socket(domain, socket.SOCK_DGRAM if domain != socket.AF_NETLINK else socket.SOCK_RAW).close()
        return 0
    except OSError as error:
        return error.errno

params = (ctypes.c_byte * 120)()
results = {
    "keyctl_get_keyring_id": raw(250, 0, -3, 0),        # KEYCTL_GET_KEYRING_ID of the session keyring
    "io_uring_setup": raw(425, 1, ctypes.addressof(params)),
    "x32_getpid": raw(0x40000000 + 39),
    "af_inet": family(socket.AF_INET),
    "af_inet6": family(socket.AF_INET6),
    "af_netlink": family(socket.AF_NETLINK),
    "af_unix": family(socket.AF_UNIX),
}
print(json.dumps(results))
"""


async def probe(config: SandboxConfig) -> dict[str, int]:
    process = await spawn("probe", sys.executable, ["-c", PROBE], {}, None, config)
    process.stdin.close()
    out, err = await process.stdout.read(), await process.stderr.read()
    await process.terminate()
    assert out, err.decode()
    return json.loads(out)


async def test_filter_denies_kernel_interfaces_that_work_unconfined():
    confined = await probe(SandboxConfig())
    unconfined = await probe(SandboxConfig(profile="none"))
    for name in ("keyctl_get_keyring_id", "io_uring_setup"):
        assert unconfined[name] == 0, f"control: {name} should work without the sandbox"
        assert confined[name] == errno.EPERM, name
    assert confined["x32_getpid"] == errno.ENOSYS


async def test_socket_families_without_network():
    confined = await probe(SandboxConfig())
    unconfined = await probe(SandboxConfig(profile="none"))
    assert unconfined["af_inet"] == unconfined["af_netlink"] == 0
    assert confined["af_inet"] == confined["af_inet6"] == confined["af_netlink"] == errno.EAFNOSUPPORT
    assert confined["af_unix"] == 0


async def test_socket_families_with_an_allowlist():
    """With egress on, IP sockets are allowed (the sandbox's own loopback is the only route); netlink is not."""
    confined = await probe(SandboxConfig(network=("127.0.0.1:9",)))
    assert confined["af_inet"] == confined["af_inet6"] == confined["af_unix"] == 0
    assert confined["af_netlink"] == errno.EAFNOSUPPORT


def test_every_listed_syscall_is_in_the_filter():
    import tempfile

    with tempfile.TemporaryFile() as out:
        filt = build_filter(network=False)
        filt.export_pfc(out.fileno())
        filt.release()
        out.seek(0)
        text = out.read().decode()
    for names in DENIED_SYSCALLS.values():
        for name in names:
            assert f'"{name}"' in text, name
    assert '"clone3"' in text and "ERRNO(38)" in text
    assert "21522" in text and "21532" in text  # TIOCSTI, TIOCLINUX


def test_bpf_is_compiled_once_per_mode():
    assert compiled_bpf(False) is compiled_bpf(False)
    assert compiled_bpf(False) != compiled_bpf(True)


@pytest.mark.parametrize("network", [False, True])
def test_bpf_is_a_whole_number_of_instructions(network):
    assert len(compiled_bpf(network)) % 8 == 0 and len(compiled_bpf(network)) > 8


def test_the_filter_is_compiled_by_the_systems_libseccomp_with_no_python_binding():
    script = ("import sys\n"
              "from bastion.sandbox.seccomp import available, compiled_bpf\n"
              "print(available()[0], len(compiled_bpf(False)) % 8)\n"
              "print(sorted(m for m in sys.modules if 'seccomp' in m.lower() and not m.startswith('bastion')))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True 0", "[]"]  # whole 8-byte BPF instructions, and no binding loaded


def test_libseccomp_refusing_a_rule_names_the_system_call():
    from bastion.sandbox.seccomp import SeccompUnavailable, _deny, _Filter

    filt = _Filter(0x7FFF0000)
    try:
        with pytest.raises(SeccompUnavailable, match="no_such_call"):
            filt.add_rule(_deny(errno.EPERM), "no_such_call")
    finally:
        filt.release()
