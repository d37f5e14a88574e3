"""Federated tool search: a hybrid lexical + semantic index over MCP tool definitions,
deterministic tool-list serialization, token economics, and the search-mode meta-tools."""

from bastion.search.canonical import canonical_tool_list, canonical_tools_bytes
from bastion.search.index import FusionWeights, ToolIndex

__all__ = ["FusionWeights", "ToolIndex", "canonical_tool_list", "canonical_tools_bytes"]
