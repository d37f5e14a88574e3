"""Bastion's HTTP frontend: Streamable HTTP of both eras and the old HTTP+SSE transport, as one ASGI app."""
