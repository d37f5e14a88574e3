"""Bastion's client authentication by a signed assertion (RFC 7523 section 2.2, ``private_key_jwt``): a short-lived
JWT whose ``iss`` and ``sub`` are Bastion's client id and whose ``aud`` is the authorization server, signed with a
private key Bastion holds and the authorization server knows the public half of. No shared secret goes over the
wire, and an assertion one authorization server received is refused by any other (its audience).

The key is a PEM file (PKCS#8 or the traditional RSA/EC forms, unencrypted), read when the configuration is (so a
missing or unusable file stops ``bastion check`` and the start with the key to fix) and again for each assertion
(so a key rotated in place is used at once).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Callable

from joserfc import jwt
from joserfc.jwk import ECKey, OKPKey, RSAKey

from bastion.transport.credentials import CredentialsError

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ASSERTION_LIFETIME = 60  # seconds: long enough for one token request, short enough to be useless if seen
# The asymmetric algorithms a client assertion may be signed with, and the key each needs. HS* (a shared secret
# posing as a signature) and none are not among them.
ALGORITHMS: dict[str, str] = {
    "RS256": "RSA", "RS384": "RSA", "RS512": "RSA", "PS256": "RSA", "PS384": "RSA", "PS512": "RSA",
    "ES256": "P-256", "ES384": "P-384", "ES512": "P-521", "EdDSA": "Ed25519",
}
_MIN_RSA_BITS = 2048
_MAX_KEY_FILE = 64 * 1024


class UnusableKey(ValueError):
    """A private key file that cannot sign assertions; the message says what to fix (never the key)."""


def _describe(kind: str) -> str:
    return {"RSA": "an RSA key", "P-256": "an EC P-256 key", "P-384": "an EC P-384 key", "P-521": "an EC P-521 key",
            "Ed25519": "an Ed25519 key"}.get(kind, kind)


def load_private_key(path: str) -> tuple[RSAKey | ECKey | OKPKey, str]:
    """The signing key in the PEM file ``path`` and its kind (``RSA``, ``P-256``, ``P-384``, ``P-521``,
    ``Ed25519``). Raises ``UnusableKey`` saying why it cannot be used."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    file = Path(path)
    try:
        if file.stat().st_size > _MAX_KEY_FILE:
            raise UnusableKey(f"{path} is too large to be a PEM private key")
        data = file.read_bytes()
    except FileNotFoundError:
        raise UnusableKey(f"{path} does not exist (relative paths are read from the configuration's folder)") from None
    except IsADirectoryError:
        raise UnusableKey(f"{path} is a directory, not a PEM private key file") from None
    except OSError as exc:
        raise UnusableKey(f"{path} cannot be read ({exc.strerror or exc})") from None
    try:
        private = load_pem_private_key(data, password=None)
    except TypeError:
        raise UnusableKey(f"{path} is encrypted with a passphrase: give Bastion an unencrypted key (kept readable "
                        "by Bastion's user alone), e.g. from a secrets manager") from None
    except (ValueError, Exception):  # noqa: BLE001 - cryptography raises several kinds for data that is no key
        raise UnusableKey(f"{path} holds no PEM private key (a public key or certificate is not one: give the private "
                        "key whose public half the authorization server has)") from None
    if isinstance(private, rsa.RSAPrivateKey):
        if private.key_size < _MIN_RSA_BITS:
            raise UnusableKey(f"{path} is a {private.key_size}-bit RSA key: use one of at least {_MIN_RSA_BITS} bits")
        return RSAKey.import_key(data), "RSA"
    if isinstance(private, ec.EllipticCurvePrivateKey):
        curve = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}.get(private.curve.name)
        if curve is None:
            raise UnusableKey(f"{path} is an EC key on {private.curve.name}: use P-256, P-384 or P-521")
        return ECKey.import_key(data), curve
    if isinstance(private, ed25519.Ed25519PrivateKey):
        return OKPKey.import_key(data), "Ed25519"
    raise UnusableKey(f"{path} is a {type(private).__name__}: use an RSA, EC (P-256, P-384, P-521) or Ed25519 key")


def default_algorithm(kind: str) -> str:
    """The algorithm a key of ``kind`` signs with when none is configured."""
    return {"RSA": "RS256", "P-256": "ES256", "P-384": "ES384", "P-521": "ES512", "Ed25519": "EdDSA"}[kind]


def check_algorithm(path: str, kind: str, algorithm: str) -> None:
    """Raise ``UnusableKey`` when the key in ``path`` (of ``kind``) cannot sign with ``algorithm``."""
    needed = ALGORITHMS.get(algorithm)
    if needed is None:
        raise UnusableKey(f"{algorithm} is not an algorithm for client assertions: use one of {', '.join(ALGORITHMS)}")
    if needed != kind:
        fits = [name for name, wants in ALGORITHMS.items() if wants == kind]
        raise UnusableKey(f"{path} is {_describe(kind)}, which cannot sign {algorithm} (that needs {_describe(needed)}): "
                        f"set signing_algorithm to {' or '.join(fits)}, or give {_describe(needed)}")


class ClientAssertion:
    """Signs client assertions for one client at one authorization server."""

    def __init__(self, key_file: str, algorithm: str | None, key_id: str | None, where: str,
                 clock: Callable[[], float] = time.time) -> None:
        self._file = key_file
        self._algorithm = algorithm
        self._key_id = key_id
        self._where = where  # "servers.NAME.auth", for messages naming the key to fix
        self._clock = clock

    def sign(self, client_id: str, audience: str) -> str:
        """A fresh assertion for a token request to the authorization server ``audience`` (its issuer)."""
        try:
            key, kind = load_private_key(self._file)
            algorithm = self._algorithm or default_algorithm(kind)
            check_algorithm(self._file, kind, algorithm)
        except UnusableKey as exc:
            raise CredentialsError(f"{self._where}.private_key_file: {exc}") from None
        now = int(self._clock())
        header = {"alg": algorithm, "typ": "JWT"}
        if self._key_id:
            header["kid"] = self._key_id
        claims = {"iss": client_id, "sub": client_id, "aud": audience, "iat": now, "nbf": now,
                  "exp": now + ASSERTION_LIFETIME, "jti": secrets.token_urlsafe(24)}
        return jwt.encode(header, claims, key, algorithms=[algorithm])
