"""Bastion: a security gateway and host runtime for the Model Context Protocol."""

__version__ = "0.1.0"
