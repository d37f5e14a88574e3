"""Content guardrails: what no sandbox stops, checked on the one request path.

Each guardrail is a pure decision function (in its own module, importing only ``bastion.model`` and its
libraries) and one interceptor that applies it. ``bastion.guardrails.chain.build_guardrails`` turns the
``[guardrails]`` configuration into those interceptors, in the order the chain needs them; the composition root
places them inside the policy, so they see only what the policy permits.
"""
