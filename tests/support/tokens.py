"""Tokens as a user's backend mints them: PyJWT, HS256, a shared signing key.

The gateway's own minting (``gateway.tokens.signed_token``) is tested by its
unit tests; the other tests mint with PyJWT as a Django project or any other
backend would, so they also check that the gateway takes tokens it did not
make.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterable, Mapping

import jwt

__all__ = ["TEST_SIGNING_KEY", "encode", "mint", "unsigned"]

#: A signing key long enough for HS256 (the gateway wants 32 bytes or more).
TEST_SIGNING_KEY = "tests-signing-key-" + "0123456789abcdef" * 3


def mint(
    sub: str,
    scopes: Iterable[str],
    ttl: float = 60.0,
    *,
    key: str = TEST_SIGNING_KEY,
    now: float | None = None,
    **claims: object,
) -> str:
    """A signed token for ``sub`` with ``scopes``, valid for ``ttl`` seconds.

    Args:
        sub: the ``sub`` claim.
        scopes: the ``scopes`` claim (a list in the token).
        ttl: seconds from ``now`` to ``exp`` (rounded up: JWT times are whole seconds).
        key: the HS256 key.
        now: the time the token is minted at; by default the clock.
        claims: more claims (``aud``, ``iss``...), or ones that replace the above.
    """
    at = time.time() if now is None else now
    body = {"sub": sub, "iat": int(at), "exp": math.ceil(at + ttl), "scopes": list(scopes)}
    return encode({**body, **claims}, key)


def encode(claims: Mapping[str, object], key: str = TEST_SIGNING_KEY, alg: str = "HS256") -> str:
    """Exactly these ``claims``, signed with ``key`` (for tokens the gateway must refuse)."""
    return jwt.encode(dict(claims), key, algorithm=alg)


def unsigned(claims: Mapping[str, object]) -> str:
    """A JWT-shaped token with these claims and a made-up signature.

    For the client's tests: the client reads ``exp`` and never checks a signature.
    """

    def part(data: Mapping[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"
