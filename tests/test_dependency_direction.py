"""Which parts of Bastion may import which, read from the source: the pure deciders and the sans-I/O protocol
never reach up into the gateway, a transport or the sandbox; the gateway builds neither policy nor search (the
composition root, bastion/compose.py, does); the transports move bytes below the gateway and the frontends sit
above it; and no two of Bastion's packages import each other, however roundabout the loop."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterable

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bastion"

# The layers a package must never import, at run time or inside a function.
FORBIDDEN = {
    "policy": ("bastion.gateway", "bastion.transport", "bastion.sandbox", "bastion.compose", "bastion.cli",
               "bastion.host", "bastion.launchers"),
    "search": ("bastion.gateway", "bastion.transport", "bastion.sandbox", "bastion.compose", "bastion.cli",
               "bastion.host", "bastion.launchers", "bastion.policy"),
    "guardrails": ("bastion.gateway", "bastion.transport", "bastion.sandbox", "bastion.compose", "bastion.cli",
                   "bastion.host", "bastion.launchers", "bastion.policy", "bastion.search", "bastion.config"),
    "protocol": ("bastion.gateway", "bastion.transport", "bastion.sandbox", "bastion.compose", "bastion.cli",
                 "bastion.host", "bastion.launchers", "bastion.policy", "bastion.search", "bastion.config"),
    # Who is calling, decided from what a request presents: the HTTP frontend asks it, it asks nothing of Bastion's.
    "auth": ("bastion.gateway", "bastion.transport", "bastion.sandbox", "bastion.compose", "bastion.cli",
             "bastion.host", "bastion.launchers", "bastion.policy", "bastion.search", "bastion.config"),
    # Upstream credentials: built by the gateway, so they never reach up into it, nor into the configuration
    # module, which imports their table (the authorization-code flow's loopback listener is a transport's).
    "credentials": ("bastion.gateway", "bastion.sandbox", "bastion.compose", "bastion.cli", "bastion.host",
                    "bastion.launchers", "bastion.policy", "bastion.search", "bastion.config"),
    # Routing only: the policy runtime, the search exposure and the tool index come from the composition root; the
    # frontends drive it from above.
    "gateway": ("bastion.policy", "bastion.search", "bastion.compose", "bastion.cli", "bastion.host",
                "bastion.frontends"),
    # Bytes below the gateway: frames, pipes, the upstream HTTP client, a listening socket. How a local server's
    # process starts (installs, the sandbox) is given to it, and so are credentials, through the interface it defines.
    "transport": ("bastion.gateway", "bastion.frontends", "bastion.sandbox", "bastion.launchers", "bastion.credentials",
                  "bastion.config", "bastion.compose", "bastion.cli", "bastion.host", "bastion.policy",
                  "bastion.search", "bastion.guardrails", "bastion.auth", "bastion.diagnostics"),
    # Watching requests (traces, metrics, the facts of JSON logs): handed to the gateway by the composition root, so
    # it never reaches into the gateway, a transport or a decider; it speaks the shared vocabulary (bastion.model).
    "observability": ("bastion.gateway", "bastion.transport", "bastion.sandbox", "bastion.frontends",
                      "bastion.compose", "bastion.cli", "bastion.host", "bastion.launchers", "bastion.policy",
                      "bastion.search", "bastion.guardrails", "bastion.credentials"),
    # Where clients come in: above the gateway, which they drive; the gateway is built for them by the composition
    # root, and what spawns servers is the gateway's.
    "frontends": ("bastion.compose", "bastion.cli", "bastion.host", "bastion.sandbox", "bastion.launchers",
                  "bastion.search", "bastion.credentials", "bastion.diagnostics"),
}

# Modules that are a layer of their own, with what they must never import.
FORBIDDEN_MODULES = {
    # The typed configuration imports the tables of what it configures, never their run time.
    "config.py": ("bastion.gateway", "bastion.frontends", "bastion.transport", "bastion.sandbox.process",
                  "bastion.launchers", "bastion.diagnostics", "bastion.compose", "bastion.cli", "bastion.host",
                  "bastion.credentials.build", "bastion.credentials.oauth_client", "bastion.policy.interceptors"),
}


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """Every bastion module the module at ``path`` (its text, or ``source``) imports when it runs, as (line,
    module): imports under ``if TYPE_CHECKING:`` are for annotations only and are left out; relative imports
    are resolved."""
    tree = ast.parse(path.read_text() if source is None else source, str(path))
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = parts if path.name == "__init__.py" else parts[:-1]
    package = package[:-1] if package[-1:] == ("__init__",) else package
    annotation_only = {id(node) for block in ast.walk(tree) if _is_type_checking(block)
                       for stmt in block.body for node in ast.walk(stmt)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in annotation_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
                # `from . import x` may name a module: count it as one.
                found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
            elif node.module:
                found.append((node.lineno, node.module))
                found.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return [(line, module) for line, module in found if module == "bastion" or module.startswith("bastion.")]


def _is_type_checking(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _within(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


@pytest.mark.parametrize("area", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(area: str) -> None:
    sources = sorted((PACKAGE / area).rglob("*.py"))
    assert sources, f"bastion/{area} has no sources: the rule would check nothing"
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
        for path in sources
        for line, module in imported_modules(path)
        if any(_within(module, layer) for layer in FORBIDDEN[area])
    ]
    assert wrong == [], "imports against the dependency direction (see docs/architecture.md):\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(FORBIDDEN_MODULES))
def test_a_module_imports_nothing_above_it(module: str) -> None:
    path = PACKAGE / module
    wrong = [f"bastion/{module}:{line} imports {imported}" for line, imported in imported_modules(path)
             if any(_within(imported, layer) for layer in FORBIDDEN_MODULES[module])]
    assert wrong == [], "imports against the dependency direction (see docs/architecture.md):\n" + "\n".join(wrong)


def package_imports() -> dict[tuple[str, str], list[str]]:
    """Every import from one of Bastion's packages into another (a top-level module, such as bastion/config.py,
    counts as a package of its own), as (importer, imported) -> where: imports in functions count too."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        for line, module in imported_modules(path):
            imported = module.split(".")[1] if module.count(".") else None
            if imported is not None and imported != parts[0]:
                found.setdefault((parts[0], imported), []).append(f"bastion/{'/'.join(parts)}.py:{line} {module}")
    return found


def loops(edges: Iterable[tuple[str, str]]) -> list[set[str]]:
    """The sets of packages that reach one another (strongly connected components of more than one)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen

    reached = {node: reach(node) for node in graph}
    found: list[set[str]] = []
    for node in sorted(graph):
        loop = {other for other in reached[node] if node in reached[other]}
        if len(loop) > 1 and loop not in found:
            found.append(loop)
    return found


def test_no_two_packages_import_each_other() -> None:
    # A loop between packages, however long and through imports inside functions too, means neither can be read,
    # tested or replaced without the other: each names the imports that close it.
    imports = package_imports()
    found = loops(imports)
    described = [
        " <-> ".join(sorted(loop)) + ":\n" + "\n".join(
            f"    {where}" for (a, b), wheres in sorted(imports.items()) if a in loop and b in loop for where in wheres)
        for loop in found
    ]
    assert found == [], "import loops between packages:\n" + "\n".join(described)


def test_the_loop_check_sees_a_long_loop() -> None:
    # The checker itself: a loop of three is one, a chain is none.
    assert loops([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [{"a", "b", "c"}]
    assert loops([("a", "b"), ("b", "c")]) == []


def test_the_shared_model_imports_nothing_of_bastion() -> None:
    # Everything speaks the model; were it to import any part, that part could never import it back.
    assert imported_modules(PACKAGE / "model.py") == []


def test_the_rules_see_imports_in_functions_and_relative_ones() -> None:
    # The checker itself: an import inside a function or written relatively counts; one for annotations does not.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from bastion.gateway.core import Gateway\n"
        "def late():\n    from bastion.gateway import core\n"
        "from ..transport import stdio\n"
    )
    found = imported_modules(PACKAGE / "policy" / "probe.py", source)
    assert (5, "bastion.gateway") in found and (5, "bastion.gateway.core") in found
    assert (6, "bastion.transport.stdio") in found
    assert all(line != 3 for line, _ in found), "an annotation-only import must not count"
