"""JWT access tokens checked locally: the signature against the issuer's key set, then iss, aud (this gateway's
resource, RFC 8707), exp and nbf with the configured clock skew.

joserfc verifies the signature, with its own implementation of the token's algorithm (``JWSRegistry.algorithms``),
once the algorithm is held to the issuer's allow-list and the key's type to the algorithm; the token is parsed
once, here, and the claims are checked here. Measured on this project's machine with a cached RS256 key: PyJWT's
``decode`` 54 µs per token, joserfc's ``jwt.decode`` 37 µs, the RSA verification alone 18 µs: joserfc, the JOSE
library authlib itself moved to, is the cheaper of the two, and calling its algorithm directly skips a second
parse of the token and its header registry. A token already verified is remembered until its exp (while its key
is still in the issuer's set), so an agent's later requests with the same token cost a dictionary look-up
(bench/auth.py)."""

from __future__ import annotations

import binascii
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import orjson
from joserfc.jws import JWSRegistry

from bastion.auth.base import AuthFailure
from bastion.auth.jwks import KEY_TYPE_OF, JwksCache, KeysUnavailable

VERIFIED_CACHE_ENTRIES = 4096
# The token types an access token may declare (RFC 9068 at+jwt, or the generic JWT most issuers write): another
# explicitly typed JWT (a DPoP proof, a logout token, a security event) is not an access token (RFC 8725 3.11).
ACCESS_TOKEN_TYPES = frozenset({"jwt", "at+jwt", "application/at+jwt"})


@dataclass(frozen=True, slots=True)
class UnverifiedToken:
    """A compact JWS read but not yet trusted: its header and claims, to route it to its issuer's keys."""

    header: Mapping[str, Any]
    claims: Mapping[str, Any]
    signing_input: bytes
    signature: bytes


_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")


def _b64(segment: bytes) -> bytes:
    """One base64url segment (already translated to the standard alphabet), strictly: no padding (RFC 7515
    section 2), no character outside the alphabet."""
    return binascii.a2b_base64(segment + b"=" * (-len(segment) % 4), strict_mode=True)


def looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2


def read_unverified(token: str) -> UnverifiedToken:
    """The token's header and claims, or AuthFailure 401 when it is not a compact JWS of JSON objects."""
    try:
        raw = token.encode("ascii")
        signing_input, _, signature_part = raw.rpartition(b".")
        header_part, payload_part, signature_part = raw.translate(_FROM_URLSAFE).split(b".")
        if b"=" in raw or b"+" in raw or b"/" in raw:  # the standard alphabet's characters, or padding
            raise ValueError("not base64url")
        header, claims = orjson.loads(_b64(header_part)), orjson.loads(_b64(payload_part))
        signature = _b64(signature_part)
    except (ValueError, binascii.Error, orjson.JSONDecodeError):
        raise _invalid("malformed_token") from None
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise _invalid("malformed_token")
    return UnverifiedToken(header, claims, signing_input, signature)


def _invalid(reason: str, message: str = "the access token could not be verified") -> AuthFailure:
    # One message for every signature, key and format problem: which of them it was helps only an attacker.
    return AuthFailure(401, message, None, "invalid_token", reason)


def check_claims(claims: Mapping[str, Any], *, issuer: str, audiences: frozenset[str], now: float,
                 skew: float) -> None:
    """iss, aud, exp, nbf and iat of verified claims (RFC 9068 section 4, RFC 8707), or AuthFailure 401."""
    if claims.get("iss") != issuer:
        raise _invalid("wrong_issuer", "the access token was not issued by an authorization server this gateway "
                                       "trusts")
    if audiences.isdisjoint(named_audiences(claims)):
        raise _invalid("wrong_audience", "the access token was not issued for this resource (its aud does not name "
                                         "it)")
    check_times(claims, now=now, skew=skew, exp_required=True)


def named_audiences(claims: Mapping[str, Any]) -> list[str]:
    audience = claims.get("aud")
    return [audience] if isinstance(audience, str) else audience if isinstance(audience, list) else []


def check_times(claims: Mapping[str, Any], *, now: float, skew: float, exp_required: bool) -> None:
    exp = claims.get("exp")
    if exp is None and not exp_required:
        pass
    elif not _is_number(exp):
        raise _invalid("no_expiry", "the access token has no valid exp claim")
    elif now > exp + skew:
        raise _invalid("expired", "the access token has expired")
    for name in ("nbf", "iat"):
        value = claims.get(name)
        if value is None:
            continue
        if not _is_number(value):
            raise _invalid("malformed_claims", f"the access token's {name} claim is not a number")
        if value > now + skew:
            raise _invalid("not_yet_valid", "the access token is not valid yet")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class JwtValidator:
    """One issuer's JWT access tokens."""

    def __init__(self, issuer: str, algorithms: list[str], keys: JwksCache, *, audiences: frozenset[str], skew: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.issuer = issuer
        self._algorithms = frozenset(algorithms)
        self._keys = keys
        self._audiences = audiences  # auth.resource, and the issuer's own names for it
        self._skew = skew
        self._clock = clock
        # token -> (claims, kid): the tokens whose signature was verified; their times are checked on every use
        # (an OrderedDict: evicting the oldest of a plain dict scans the slots its earlier evictions left, which took
        # milliseconds once the cache was full)
        self._verified: OrderedDict[str, tuple[Mapping[str, Any], str]] = OrderedDict()

    def recall(self, token: str) -> Mapping[str, Any] | None:
        """The claims of a token this validator verified before, while its key is in the set and it is within its
        times (AuthFailure once it expired); None for a token it has not verified."""
        seen = self._verified.get(token)
        if seen is None:
            return None
        claims, kid = seen
        if not self._keys.known(kid):
            del self._verified[token]
            return None
        check_times(claims, now=self._clock(), skew=self._skew, exp_required=True)
        return claims

    async def validate(self, token: str, unverified: UnverifiedToken) -> Mapping[str, Any]:
        """The token's claims once its signature and claims hold, or AuthFailure."""
        now = self._clock()
        header = unverified.header
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self._algorithms:
            raise _invalid("algorithm_not_allowed")
        typ = header.get("typ")
        if typ is not None and (not isinstance(typ, str) or typ.lower() not in ACCESS_TOKEN_TYPES):
            raise _invalid("not_an_access_token")
        if "crit" in header:  # no critical extension is understood here, so none may be ignored (RFC 7515 4.1.11)
            raise _invalid("critical_header")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise _invalid("malformed_token")
        try:
            key = await self._keys.key(kid)
        except KeysUnavailable:
            raise AuthFailure(503, "the authorization server's signing keys cannot be fetched right now; retry "
                                   "later", None, "temporarily_unavailable", "keys_unavailable") from None
        if key is None:
            raise _invalid("unknown_key")
        kty, curve = KEY_TYPE_OF[alg]
        if key.key_type != kty or (curve is not None and getattr(key, "curve_name", None) != curve):
            raise _invalid("key_type_mismatch")
        key_alg = key.get("alg") if hasattr(key, "get") else None
        if key_alg is not None and key_alg != alg:
            raise _invalid("key_algorithm_mismatch")
        try:
            verified = JWSRegistry.algorithms[alg].verify(unverified.signing_input, unverified.signature, key)
        except ValueError:  # a signature of the wrong length for the key, among others
            verified = False
        if not verified:
            raise _invalid("bad_signature")
        claims = unverified.claims  # the very payload just verified
        check_claims(claims, issuer=self.issuer, audiences=self._audiences, now=now, skew=self._skew)
        if len(self._verified) >= VERIFIED_CACHE_ENTRIES:
            self._verified.popitem(last=False)
        self._verified[token] = (claims, kid if kid is not None else (key.kid or ""))
        return claims
