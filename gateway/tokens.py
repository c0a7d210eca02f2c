"""Signed connection tokens (protocol 1.1: Signed connection tokens and token lifetime).

A signed token is a JWT signed with HS256, whose key is the UTF-8 bytes of
the ``GATEWAY_SIGNING_KEY`` setting. Nothing about it is stored: the gateway
checks the signature and the claims on every use.

- ``sub`` (required): who the token is for, 1-200 characters.
- ``exp`` (required): when it expires, Unix seconds. A token is valid while
  the clock is before ``exp``.
- ``scopes``: a list of scope strings, with the syntax of stored tokens'
  scopes (:mod:`gateway.scopes`). Left out, the token may do nothing.

A Django project hands one to the page of a logged-in user::

    from gateway.tokens import signed_token

    def leasecast_token(request):
        scopes = [f"subscribe:user.{request.user.pk}.*"]
        return JsonResponse({"token": signed_token(str(request.user.pk), scopes, ttl=300)})

Verification (:func:`verify_signed_token`) is pure: no Django, an injected
clock, the key passed in. Every refusal is :class:`~gateway.errors.Unauthorized`
with a detail that names what was wrong with the token and never the key or
the token's contents.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import jwt

from gateway.errors import Invalid, Unauthorized
from gateway.scopes import Principal, parse_scopes

__all__ = [
    "ALGORITHM",
    "MAX_SUBJECT_LENGTH",
    "SignedClaims",
    "is_signed_token",
    "principal_for_claims",
    "signed_token",
    "verify_signed_token",
]

#: The only algorithm accepted: a token that names any other (``none``
#: included) is refused before its signature is even looked at.
ALGORITHM = "HS256"
#: Longest ``sub`` accepted.
MAX_SUBJECT_LENGTH = 200


@dataclass(frozen=True, slots=True)
class SignedClaims:
    """The checked claims of a signed token."""

    sub: str
    exp: float
    scopes: tuple[str, ...]


def is_signed_token(secret: str) -> bool:
    """Does this bearer secret look like a JWT (three dot-separated parts)?

    Stored tokens (``lc_`` and URL-safe base64) never contain a dot, so the
    two kinds cannot be confused: a secret with dots is only ever checked as a
    signed token, never looked up in the database.
    """
    return secret.count(".") == 2


def _check_subject(sub: object) -> str:
    if not isinstance(sub, str) or not 1 <= len(sub) <= MAX_SUBJECT_LENGTH:
        raise Invalid(f"sub must be a string of 1-{MAX_SUBJECT_LENGTH} characters")
    return sub


def signed_token(
    sub: str,
    scopes: Iterable[str],
    ttl: float,
    *,
    key: str | None = None,
    now: float | None = None,
) -> str:
    """Mint a signed token for ``sub`` with ``scopes``, valid for ``ttl`` seconds.

    Args:
        sub: who the token is for (e.g. the Django user's primary key), 1-200 characters.
        scopes: scope strings, as for stored tokens (``subscribe:orders.*``).
        ttl: seconds from now until ``exp`` (rounded up to a whole second: JWT
            times are integers), more than 0.
        key: the signing key; by default the ``GATEWAY_SIGNING_KEY`` setting.
        now: the current Unix time (for tests); by default the clock.

    Returns:
        The token, to send as ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``.

    Raises:
        Invalid: an empty or over-long ``sub``, a bad scope, or ``ttl`` not above 0.
        django.core.exceptions.ImproperlyConfigured: no ``key`` and no
            ``GATEWAY_SIGNING_KEY`` setting.
    """
    _check_subject(sub)
    checked = parse_scopes(list(scopes))
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or not ttl > 0:
        raise Invalid("ttl must be a number of seconds above 0")
    if key is None:
        from django.core.exceptions import ImproperlyConfigured

        from gateway.conf import gateway_settings

        key = gateway_settings().signing_key
        if not key:
            raise ImproperlyConfigured("GATEWAY_SIGNING_KEY is not set: signed tokens are off")
    if not key:
        raise Invalid("the signing key must not be empty")
    issued = time.time() if now is None else now
    exp = int(-(-(issued + ttl) // 1))  # ceil: never shorter than asked
    claims = {"sub": sub, "exp": exp, "iat": int(issued), "scopes": list(checked)}
    return jwt.encode(claims, key.encode(), algorithm=ALGORITHM)


def verify_signed_token(token: str, key: bytes, *, now: float | None = None) -> SignedClaims:
    """Check a signed token's signature and claims.

    Args:
        token: the bearer secret.
        key: the signing key's bytes; empty means signed tokens are off.
        now: the current Unix time (for tests); by default the clock.

    Returns:
        The claims, once every check passed.

    Raises:
        Unauthorized: no key configured; not a JWT; another algorithm than
            HS256 (``none`` included); a wrong signature; ``exp`` or ``sub``
            missing or of the wrong type; expired (``now`` at or past
            ``exp``); ``scopes`` not a list of valid scope strings.
    """
    if not key:
        # Never check against an empty key: anyone could sign with it.
        raise Unauthorized("signed tokens are not accepted by this gateway")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.InvalidTokenError:
        raise Unauthorized("malformed signed token") from None
    if header.get("alg") != ALGORITHM:
        raise Unauthorized(f"signed tokens must use {ALGORITHM}")
    try:
        # exp is checked below against the injected clock; PyJWT checks the
        # signature, the algorithm again, and nbf/iat when present.
        claims = jwt.decode(
            token,
            key,
            algorithms=[ALGORITHM],
            options={"verify_exp": False, "verify_sub": False, "require": ["exp", "sub"]},
        )
    except jwt.MissingRequiredClaimError as exc:
        raise Unauthorized(f"signed token without the {exc.claim!r} claim") from None
    except jwt.InvalidSignatureError:
        raise Unauthorized("signed token with a wrong signature") from None
    except jwt.ImmatureSignatureError:
        raise Unauthorized("signed token not valid yet") from None
    except jwt.PyJWTError:
        raise Unauthorized("malformed signed token") from None
    exp = claims["exp"]
    if not isinstance(exp, int | float) or isinstance(exp, bool):
        raise Unauthorized("signed token whose 'exp' is not a number")
    if (time.time() if now is None else now) >= exp:
        raise Unauthorized("signed token expired")
    try:
        sub = _check_subject(claims["sub"])
        scopes = parse_scopes(claims.get("scopes", []))
    except Invalid as exc:
        raise Unauthorized(f"signed token with bad claims: {exc.detail[:200]}") from None
    return SignedClaims(sub=sub, exp=float(exp), scopes=scopes)


def principal_for_claims(claims: SignedClaims) -> Principal:
    """The caller a signed token stands for: named ``signed:SUB``, with its scopes and expiry."""
    return Principal.from_scopes(
        f"signed:{claims.sub}", claims.scopes, subject=claims.sub, expires_at=claims.exp
    )
