"""Runs inside a sandbox: exposes the egress proxy's UNIX socket on loopback TCP, then runs the server.

Usage: forwarder.py HOST:PORT SOCKET -- COMMAND [ARGS...]
Standard library only, started with ``python -I -S``: it must not import anything from the server's
environment. The server keeps stdin/stdout/stderr; this process relays bytes and exits with its status.
"""

import os
import selectors
import signal
import socket
import sys
import threading


def relay(left: socket.socket, right: socket.socket) -> None:
    selector = selectors.DefaultSelector()
    selector.register(left, selectors.EVENT_READ, right)
    selector.register(right, selectors.EVENT_READ, left)
    open_sides = 2
    try:
        while open_sides:
            for key, _ in selector.select():
                source, target = key.fileobj, key.data
                data = source.recv(65536)
                if data:
                    target.sendall(data)
                else:
                    selector.unregister(source)
                    open_sides -= 1
                    try:
                        target.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
    except OSError:
        pass
    finally:
        selector.close()
        left.close()
        right.close()


def serve(listener: socket.socket, socket_path: str) -> None:
    while True:
        client, _ = listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(socket_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        threading.Thread(target=relay, args=(client, upstream), daemon=True).start()


def main(argv: list[str]) -> int:
    address, socket_path, separator, *command = argv
    if separator != "--" or not command:
        print("usage: forwarder.py HOST:PORT SOCKET -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    host, _, port = address.rpartition(":")
    listener = socket.create_server((host, int(port)), reuse_port=False)
    os.set_inheritable(listener.fileno(), False)
    child = os.fork()
    if child == 0:
        listener.close()
        try:
            os.execv(command[0], command)
        except OSError as error:
            print(f"cannot run {command[0]}: {error}", file=sys.stderr)
            os._exit(127)
    # The server owns stdin/stdout: this process must not read or write them.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda number, _frame: os.kill(child, number))
    threading.Thread(target=serve, args=(listener, socket_path), daemon=True).start()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
