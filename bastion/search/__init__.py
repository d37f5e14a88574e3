"""Federated tool search: a hybrid lexical + semantic index over MCP tool definitions,
deterministic tool-list serialization, token economics, and the search-mode meta-tools."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bastion.search.canonical import canonical_tool_list, canonical_tools_bytes

if TYPE_CHECKING:
    from bastion.search.index import FusionWeights, ToolIndex

__all__ = ["FusionWeights", "ToolIndex", "canonical_tool_list", "canonical_tools_bytes"]


def __getattr__(name: str) -> Any:
    # The index brings numpy, bm25s and a model runtime: a gateway whose exposure is "auto" imports this package
    # for its size check and must not load them while its catalog is small.
    if name in ("FusionWeights", "ToolIndex"):
        from bastion.search import index

        return getattr(index, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
