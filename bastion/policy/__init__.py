"""Policy gateway: Cedar authorization, argument guards, human approval, rate limits and an audit trail.

Each part is imported from its own module (`bastion.policy.engine`, `.cedar_engine`, `.interceptors`, ...), so
that a command importing one of them (`bastion check` needs the engine, not the interceptors) pays for no other.
"""
