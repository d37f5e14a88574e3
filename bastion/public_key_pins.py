"""How a remote server's public-key pin is written: ``sha256//BASE64``, as HPKP and ``curl --pinnedpubkey`` write it.

Only the format lives here, for the configuration to check when it is read; the check of a connection against the
pins is the HTTP client's (bastion/transport/spki.py).
"""

from __future__ import annotations

import re

PIN_PREFIX = "sha256//"
_PIN = re.compile(r"sha256//[A-Za-z0-9+/]{43}=")  # 32 bytes of SHA-256, base64 with its padding
HOW_TO_PIN = ("compute it with: openssl s_client -connect HOST:PORT -servername HOST </dev/null | openssl x509 -pubkey "
              "-noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | openssl enc -base64 "
              "(and write sha256// before it)")


def pin_problem(value: str) -> str | None:
    """Why ``value`` is not a pin, or None."""
    if _PIN.fullmatch(value) is None:
        return (f"{value!r} is not a public-key pin: write sha256// followed by the base64 SHA-256 of the server "
                f"certificate's SubjectPublicKeyInfo (44 characters ending in =); {HOW_TO_PIN}")
    return None
