"""MCP clients' own configurations: finding them, importing their servers into Bastion, pointing clients at it."""

from bastion.clients.grants import GrantInference, ServerReview, infer_grants, merge_sandbox, review, with_inferred_grants

__all__ = ["GrantInference", "ServerReview", "infer_grants", "merge_sandbox", "review", "with_inferred_grants"]
