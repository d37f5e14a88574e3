"""Every module that adds subcommands to ``bastion``; each exposes ``register(subparsers)``."""

REGISTRARS: list = []
