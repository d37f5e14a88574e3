"""A framework-free handshake-era MCP server on stdio that counts what it runs, for the replica tests and the load
generator: every replica behind the balancer starts its own copy, and all copies append to one marks file
(``COUNTING_MARKS``), so a test can tell that each call (named by the ``tag`` its caller chose) ran at most once,
whichever replica took it.

Tools: ``echo`` (read-only) answers its tag; ``slow`` (read-only) marks ``start``, waits ``seconds`` (or until
cancelled), marks ``done`` and answers its tag; ``write`` (no annotations: the default policy asks a person) answers
its tag; ``big`` (read-only) answers a text of ``size`` characters, unmarked (the fault run's large results);
``announce`` (read-only) sends ``count`` ``notifications/resources/updated`` for ``uri``, each carrying
``_meta: {"writer": W, "seq": N}`` (N from 0) and ``pad`` characters of padding, then answers its tag (the fault run's
concurrent resource writers, of the resources it lists: ``count://burst``, ``count://stall``; resources/subscribe and
unsubscribe are answered and left to the gateway). Marks:
``run R <tag>`` (echo, write), ``start R <tag>``, ``done R <tag>``, ``cancelled R <tag>`` (R: the replica,
``COUNTING_REPLICA``), one line each, written with one append so that the copies' lines never interleave.
"""

import json
import os
import sys
import threading

MARKS = os.environ.get("COUNTING_MARKS")
REPLICA = os.environ.get("COUNTING_REPLICA", "-")
READ_ONLY = {"readOnlyHint": True}
TAG = {"type": "object", "properties": {"tag": {"type": "string"}}, "required": ["tag"]}
TOOLS = [
    {"name": "echo", "description": "Answer the tag", "inputSchema": TAG, "annotations": READ_ONLY},
    {"name": "slow", "description": "Answer the tag after some seconds (or never, when cancelled)",
     "inputSchema": {"type": "object", "properties": {"tag": {"type": "string"}, "seconds": {"type": "number"}},
                     "required": ["tag"]}, "annotations": READ_ONLY},
    {"name": "write", "description": "Record the tag", "inputSchema": TAG},
    {"name": "big", "description": "Answer a text of the given size",
     "inputSchema": {"type": "object", "properties": {"size": {"type": "integer"}}}, "annotations": READ_ONLY},
    {"name": "announce", "description": "Announce that a resource changed, count times",
     "inputSchema": {"type": "object", "properties": {
         "tag": {"type": "string"}, "uri": {"type": "string"}, "writer": {"type": "string"},
         "count": {"type": "integer"}, "pad": {"type": "integer"}}, "required": ["tag", "uri"]},
     "annotations": READ_ONLY},
]
# What ``announce`` is about: the gateway routes a subscription to the server that lists its URI.
RESOURCES = [{"uri": "count://burst", "name": "burst"}, {"uri": "count://stall", "name": "stall"}]
lock = threading.Lock()
waits: dict = {}  # request id -> (token, event set by its cancellation)


def mark(event: str, token: str) -> None:
    if MARKS:
        descriptor = os.open(MARKS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, f"{event} {REPLICA} {token}\n".encode())
        finally:
            os.close(descriptor)


def send(message: dict) -> None:
    data = json.dumps(message) + "\n"
    with lock:
        sys.stdout.write(data)
        sys.stdout.flush()


def answer(rid, token: str) -> None:
    send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": token}]}})


def slow(rid, token: str, seconds: float, cancelled: threading.Event) -> None:
    mark("start", token)
    if cancelled.wait(seconds):
        mark("cancelled", token)
        return
    waits.pop(rid, None)
    mark("done", token)
    answer(rid, token)


for line in sys.stdin:
    message = json.loads(line)
    method, rid, params = message.get("method"), message.get("id"), message.get("params") or {}
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-11-25"),
            "capabilities": {"tools": {}, "resources": {"subscribe": True}},
            "serverInfo": {"name": "counting", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "resources/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"resources": RESOURCES}})
    elif method == "notifications/cancelled":
        waiting = waits.pop(params.get("requestId"), None)
        if waiting is not None:
            waiting.set()
    elif method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments") or {}
        token = str(arguments.get("tag", ""))
        if name in ("echo", "write"):
            mark("run", token)
            answer(rid, token)
        elif name == "big":
            answer(rid, "x" * int(arguments.get("size", 0)))
        elif name == "announce":
            writer, pad = str(arguments.get("writer", "")), "p" * int(arguments.get("pad", 0))
            for seq in range(int(arguments.get("count", 1))):
                send({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {
                    "uri": arguments["uri"], "_meta": {"writer": writer, "seq": seq, **({"pad": pad} if pad else {})}}})
            answer(rid, token)
        elif name == "slow":
            cancelled = threading.Event()
            waits[rid] = cancelled
            threading.Thread(target=slow, args=(rid, token, float(arguments.get("seconds", 1)), cancelled),
                             daemon=True).start()
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": f"Unknown tool: {name}"}})
    elif rid is not None and method is not None:
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
