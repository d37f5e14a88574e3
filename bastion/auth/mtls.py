"""Client certificates: a caller whose TLS certificate the handshake verified against ``http.client_ca_file`` is
the identity ``auth.client_certificates`` maps one of its names to.

The TLS layer has done the cryptography by the time a request gets here: a certificate that does not chain to the
configured CA, or has expired, ended the handshake, so this method only reads the names of a certificate already
proven. Each ``auth.client_certificates`` key says which kind of name it matches, so a DNS name in one
certificate can never pass for the common name another was mapped by:

    "cn:build-agent"                      = "ci"       # the subject's commonName
    "email:alice@example.com"             = "alice"    # a subjectAltName rfc822Name
    "uri:spiffe://example.org/ns/agents"  = "agents"   # a subjectAltName URI (SPIFFE IDs)
    "dns:agent.example.com"               = "agent"    # a subjectAltName dNSName
    "cn:deployer" = { name = "deployer", groups = ["ops"] }   # with groups, the Cedar principal's parents
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from bastion.auth.base import AuthFailure, Credentials
from bastion.model import Identity

KINDS = ("cn", "email", "uri", "dns")
# ssl.getpeercert()'s subjectAltName type names -> the kinds above
_SAN_KINDS = {"email": "email", "URI": "uri", "DNS": "dns"}
# names compared without regard to case, as DNS and mail domains are (a CA issues them lower-case in practice)
_CASELESS = frozenset(("email", "dns"))

Name = tuple[str, str]  # (kind, value)


def _normal(kind: str, value: str) -> Name:
    return kind, value.lower() if kind in _CASELESS else value


@dataclass(frozen=True, slots=True)
class Mapped:
    """The identity a certificate name maps to."""

    name: str
    groups: tuple[str, ...] = ()


def parse_mapping(mapping: Mapping[str, Any]) -> dict[Name, Mapped]:
    """``auth.client_certificates`` as (kind, name) -> identity; each value a name, or anything with ``name`` and
    ``groups`` (the configuration's table, or a plain mapping); a ValueError names the key and the fix."""
    parsed: dict[Name, Mapped] = {}
    for key, identity in mapping.items():
        kind, sep, value = key.partition(":")
        kind = kind.strip().lower()
        if not sep or kind not in KINDS or not value.strip():
            raise ValueError(f"auth.client_certificates.{key!r}: say which of the certificate's names it matches, "
                             f'as "cn:NAME", "email:ADDRESS", "uri:URI" or "dns:HOSTNAME"')
        if isinstance(identity, Mapping):
            name, groups = identity.get("name"), identity.get("groups") or ()
        elif isinstance(identity, str):
            name, groups = identity, ()
        else:
            name, groups = getattr(identity, "name", None), getattr(identity, "groups", ())
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"auth.client_certificates.{key!r}: the identity it maps to must be a non-empty name")
        parsed[_normal(kind, value.strip())] = Mapped(name.strip(), tuple(groups))
    return parsed


def certificate_names(certificate: Mapping[str, Any]) -> list[Name]:
    """Every name of a certificate in ``ssl.getpeercert()`` form: its subject's commonNames, then its SANs."""
    names: list[Name] = []
    for rdn in certificate.get("subject", ()):
        for attribute, value in rdn:
            if attribute == "commonName":
                names.append(_normal("cn", value))
    for san_type, value in certificate.get("subjectAltName", ()):
        if san_type in _SAN_KINDS:
            names.append(_normal(_SAN_KINDS[san_type], value))
    return names


@dataclass
class ClientCertificateMethod:
    """The ``AuthMethod`` for verified client certificates."""

    mapping: Mapping[Name, Mapped]
    asks = "a client certificate"

    @classmethod
    def from_config(cls, client_certificates: Mapping[str, Any]) -> "ClientCertificateMethod":
        return cls(parse_mapping(client_certificates))

    def presented(self, credentials: Credentials) -> bool:
        return bool(credentials.peer_certificate)

    def challenge(self) -> str | None:
        return None  # a certificate is asked for in the TLS handshake, not in an HTTP challenge

    async def authenticate(self, credentials: Credentials) -> Identity:
        names = certificate_names(credentials.peer_certificate or {})
        identities = {self.mapping[name] for name in names if name in self.mapping}
        if not identities:
            raise AuthFailure(403, "the client certificate is valid but none of its names is mapped to an identity "
                                   "(auth.client_certificates)", None, "invalid_token", "unmapped_certificate")
        if len(identities) > 1:
            # two entries claim one certificate: refusing is the only answer that cannot grant the wrong one
            raise AuthFailure(403, "the client certificate's names map to more than one identity in "
                                   "auth.client_certificates; map only one of them", None, "invalid_token",
                              "ambiguous_certificate")
        mapped = identities.pop()
        return Identity(mapped.name, mapped.groups, "mtls")
