"""The web console at ``/admin`` (and ``bastion console`` beside a stdio deployment): what the gateway is doing, and
the operator's acts on it, each decided by Cedar and audited (docs/operations.md)."""
