"""The Cedar schema Bastion's requests follow, and the default policy shipped with Bastion."""

from __future__ import annotations

NAMESPACE = "Bastion"

# The principal's own attributes, always present; the names auth.claims.attributes adds must differ from them.
PRINCIPAL_ATTRIBUTES = ("scopes", "authenticated_by", "issuer")

SCHEMA_TEMPLATE = """
namespace Bastion {
  entity Group;
  // The caller: its groups are its parents; scopes are its token's (empty without one), authenticated_by is
  // "configured", "header", "oauth", "api_key" or "mtls", issuer the token's issuer ("" without one); every attribute
  // auth.claims.attributes names is a String ("" when the token lacks the claim).
  entity User in [Group] = {
    scopes: Set<String>,
    authenticated_by: String,
    issuer: String,@CLAIMS@
  };
  entity Server = { trust: String };
  // Effective annotations: hints from servers neither trusted nor reviewed are ignored (see docs/policy.md).
  entity Tool in [Server] = {
    name: String,
    server: String,
    trust: String,
    read_only: Bool,
    destructive: Bool,
    idempotent: Bool,
    open_world: Bool,
    annotations_trusted: Bool,
    pinned: Bool,
  };
  entity Resource in [Server] = { uri: String, server: String, trust: String };
  entity Prompt in [Server] = { name: String, server: String, trust: String };
  // Tool-call arguments as tags: strings as sent, other JSON values as their JSON text.
  entity Arguments tags String;

  type Session = {
    era: String,
    protocol_version: String,
    session_id: String,
    client_name: String,
    // The servers whose content this session read and that may steer the model (docs/guardrails.md).
    tainted_by: Set<String>,
  };
  type CallContext = { arguments: Arguments, session: Session };

  action list_tools, list_resources, list_prompts
    appliesTo { principal: User, resource: Server, context: CallContext };
  action call_tool appliesTo { principal: User, resource: Tool, context: CallContext };
  action read_resource appliesTo { principal: User, resource: Resource, context: CallContext };
  action get_prompt appliesTo { principal: User, resource: Prompt, context: CallContext };
  // Server-to-client requests the client is asked to answer.
  action answer_sampling, answer_elicitation, answer_roots
    appliesTo { principal: User, resource: Server, context: CallContext };

  // Operating the gateway (docs/operations.md): reading /metrics, reading the web console, and acting from it;
  // operation names the act ("approve", "deny", "accept_tool_change", "reject_tool_change", "retry_server",
  // "reload"; "" for the two reads), so a policy may allow some acts and not others.
  entity Console;
  type AdminContext = { operation: String };
  action view_metrics, view_console, administer
    appliesTo { principal: User, resource: Console, context: AdminContext };
}
"""


def schema(claim_attributes: tuple[str, ...] = ()) -> str:
    """The schema with the principal attributes ``auth.claims.attributes`` names, each a String."""
    return SCHEMA_TEMPLATE.replace("@CLAIMS@", "".join(f"\n    {name}: String," for name in claim_attributes))


SCHEMA = schema()

DEFAULT_POLICY = """
// Bastion's default policy. Tool annotations count only when the server is configured trust = "trusted" or
// "reviewed" (resource.annotations_trusted); an untrusted server's tools are treated as not read-only,
// destructive and open-world.

@id("default-discovery")
permit (
  principal,
  action in [Bastion::Action::"list_tools", Bastion::Action::"list_resources", Bastion::Action::"list_prompts"],
  resource
);

@id("default-read-only-tools")
permit (principal, action == Bastion::Action::"call_tool", resource)
when { resource.read_only };

// Everything else a tool does (writes, deletes, network side effects) waits for a person.
@id("default-other-tools-need-approval")
@approval("required")
permit (principal, action == Bastion::Action::"call_tool", resource)
unless { resource.read_only };

@id("default-read-resources")
permit (principal, action == Bastion::Action::"read_resource", resource);

@id("default-get-prompts")
permit (principal, action == Bastion::Action::"get_prompt", resource);

@id("default-elicitation-and-roots")
permit (
  principal,
  action in [Bastion::Action::"answer_elicitation", Bastion::Action::"answer_roots"],
  resource
);

// Sampling spends the user's model budget and feeds server text to the model: any server may ask while one of
// its calls is in flight, and the sampling guardrail holds every request to its budgets (docs/guardrails.md).
@id("default-sampling")
permit (principal, action == Bastion::Action::"answer_sampling", resource);

// The gateway's metrics and web console are for its operators: the members of group "admins" (an HTTP identity's
// groups come from its token, key or certificate mapping; a stdio deployment's `bastion console` login is one).
@id("default-admins-operate")
permit (
  principal in Bastion::Group::"admins",
  action in [Bastion::Action::"view_metrics", Bastion::Action::"view_console", Bastion::Action::"administer"],
  resource
);
"""

# What an operator may do, as Cedar actions on the one Console entity.
ADMIN_ACTIONS = ("view_metrics", "view_console", "administer")
