"""Whether a locked tree is what its request asks for: a lock entry is reused only when it is.

A lock written by an older Bastion, edited by hand or carried from another file may record a tree that contradicts
the command line (``mcp`` 2.x for ``uvx --with "mcp<2" …``); reusing it would run what the configuration refused.
Python requirements are checked with the requirement grammar pip itself uses (every package named, each version in
its range); npm requests are checked for every package named and an exact version where one is written (npm's own
install is what reads a range).
"""

from __future__ import annotations

from typing import Any, Mapping

from bastion.launchers.plan import LaunchPlan, split_npm_spec


def unsatisfied(plan: LaunchPlan, version: str, tree: Mapping[str, Any]) -> str | None:
    """Why ``version`` with ``tree`` does not satisfy ``plan``'s request, or None when it does."""
    if plan.pinned is not None and version != plan.pinned:
        return f"{plan.package} {version} is not the {plan.pinned} asked for"
    if not tree:
        return None  # a lock without its tree (older format): only the version can be checked
    if plan.ecosystem == "npm":
        return _npm_unsatisfied(plan, tree)
    return _python_unsatisfied(plan, version, tree)


def _npm_unsatisfied(plan: LaunchPlan, tree: Mapping[str, Any]) -> str | None:
    for spec in (plan.requested, *plan.extras):
        name, wanted = split_npm_spec(spec)
        facts = tree.get(f"node_modules/{name}")
        if not isinstance(facts, Mapping):
            return f"the locked tree has no {name}"
        if plan.pinned is not None and spec == plan.requested:
            continue  # checked above
        if wanted and _exact(wanted) and facts.get("version") != wanted:
            return f"the locked tree has {name} {facts.get('version')}, not the {wanted} asked for"
    return None


def _exact(version: str) -> bool:
    return all(part.isdigit() for part in version.split(".")) and version.count(".") == 2


def _python_unsatisfied(plan: LaunchPlan, version: str, tree: Mapping[str, Any]) -> str | None:
    # pip's own requirement grammar (PEP 508): pip installs every Python package, so it is there whenever this runs.
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement

    for text in (plan.requested, *plan.extras):
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            return f"{text!r} is not a requirement pip reads"
        name = _normal(requirement.name)
        facts = tree.get(name)
        if not isinstance(facts, Mapping):
            return f"the locked tree has no {requirement.name}"
        found = str(facts.get("version", ""))
        if requirement.specifier and not requirement.specifier.contains(found, prereleases=True):
            return f"the locked tree has {requirement.name} {found}, which is not {requirement.specifier}"
    if _normal(plan.package) in tree and str(tree[_normal(plan.package)].get("version")) != version:
        return f"the locked tree has {plan.package} {tree[_normal(plan.package)].get('version')}, not {version}"
    return None


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
