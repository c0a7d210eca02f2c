"""Signed connection tokens (protocol 1.1: Signed connection tokens and token lifetime).

A signed token is a JWT signed with HS256, whose key is the UTF-8 bytes of
the ``GATEWAY_SIGNING_KEY`` setting. Nothing about it is stored: the gateway
checks the signature and the claims on every use.

- ``sub`` (required): who the token is for, 1-200 characters.
- ``exp`` (required): when it expires, Unix seconds. A token is valid while
  the clock is before ``exp``.
- ``scopes``: a list of scope strings, with the syntax of stored tokens'
  scopes (:mod:`gateway.core.scopes`). Left out, the token may do nothing.
- ``aud`` and ``iss``: looked at only when the gateway is bound to an
  audience (``GATEWAY_SIGNING_AUDIENCE``) or an issuer
  (``GATEWAY_SIGNING_ISSUER``); then a token must carry the same (``aud`` may
  be a list holding it), so a key shared with other services does not make
  their tokens good here.
- ``info``: optional, a JSON object of at most 1 KiB (compact JSON) that the
  presence of topics shows beside the subscriber (docs/protocol.md,
  "Presence"); any other value, or a larger one, and the token is refused.

``exp`` must be a finite number no more than ``GATEWAY_SIGNING_MAX_TTL``
seconds (default a day) after now: a token that would live longer, or whose
``exp`` is NaN or infinite (NaN compares false with every time, so it never
expired), is refused.

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

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import jwt

from gateway.core.errors import Invalid, Unauthorized
from gateway.core.presence import check_info
from gateway.core.scopes import Principal, parse_scopes

__all__ = [
    "ALGORITHM",
    "DEFAULT_MAX_TTL",
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
#: ``GATEWAY_SIGNING_MAX_TTL``'s default: the longest a signed token may still
#: live when it is used, in seconds (a day).
DEFAULT_MAX_TTL = 86400.0
#: How far ahead of this process's clock the minting application's may be:
#: a token minted for exactly the maximum is not refused for it.
CLOCK_SLACK = 60.0


@dataclass(frozen=True, slots=True)
class SignedClaims:
    """The checked claims of a signed token."""

    sub: str
    exp: float
    scopes: tuple[str, ...]
    #: the ``info`` claim as compact JSON text, or None
    info: str | None = None


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
    audience: str | None = None,
    issuer: str | None = None,
    max_ttl: float | None = None,
    info: dict[str, object] | None = None,
) -> str:
    """Mint a signed token for ``sub`` with ``scopes``, valid for ``ttl`` seconds.

    Args:
        sub: who the token is for (e.g. the Django user's primary key), 1-200 characters.
        scopes: scope strings, as for stored tokens (``subscribe:orders.*``).
        ttl: seconds from now until ``exp`` (rounded up to a whole second: JWT
            times are integers), more than 0.
        key: the signing key; by default the ``GATEWAY_SIGNING_KEY`` setting.
        now: the current Unix time (for tests); by default the clock.
        audience: the ``aud`` claim; without ``key``, by default the
            ``GATEWAY_SIGNING_AUDIENCE`` setting (none if unset).
        issuer: the ``iss`` claim; without ``key``, by default the
            ``GATEWAY_SIGNING_ISSUER`` setting (none if unset).
        max_ttl: the longest ``ttl`` allowed; by default the
            ``GATEWAY_SIGNING_MAX_TTL`` setting without ``key``, else a day.
        info: the ``info`` claim: what presence shows about this subscriber
            (a JSON object of at most 1 KiB).

    Returns:
        The token, to send as ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``.

    Raises:
        Invalid: an empty or over-long ``sub``, a bad scope, ``ttl`` not above
            0 or over the maximum, an empty ``audience`` or ``issuer``, an
            ``info`` that is not a JSON object of at most 1 KiB.
        django.core.exceptions.ImproperlyConfigured: no ``key`` and no
            ``GATEWAY_SIGNING_KEY`` setting.
    """
    _check_subject(sub)
    checked = parse_scopes(list(scopes))
    check_info(info)
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or not ttl > 0:
        raise Invalid("ttl must be a number of seconds above 0")
    if key is None:
        from django.core.exceptions import ImproperlyConfigured

        from gateway.conf import gateway_settings

        configured = gateway_settings()
        key = configured.signing_key
        if not key:
            raise ImproperlyConfigured("GATEWAY_SIGNING_KEY is not set: signed tokens are off")
        audience = (configured.signing_audience or None) if audience is None else audience
        issuer = (configured.signing_issuer or None) if issuer is None else issuer
        max_ttl = configured.signing_max_ttl if max_ttl is None else max_ttl
    if not key:
        raise Invalid("the signing key must not be empty")
    limit = DEFAULT_MAX_TTL if max_ttl is None else max_ttl
    if limit > 0 and ttl > limit:
        raise Invalid(
            f"ttl {ttl:g} s is over the longest a token may live "
            f"({limit:g} s, GATEWAY_SIGNING_MAX_TTL)"
        )
    issued = time.time() if now is None else now
    exp = int(-(-(issued + ttl) // 1))  # ceil: never shorter than asked
    claims: dict[str, object] = {
        "sub": sub,
        "exp": exp,
        "iat": int(issued),
        "scopes": list(checked),
    }
    if info is not None:
        claims["info"] = info
    for name, value in (("aud", audience), ("iss", issuer)):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise Invalid(
                    f"{'audience' if name == 'aud' else 'issuer'} must be a non-empty string"
                )
            claims[name] = value
    return jwt.encode(claims, key.encode(), algorithm=ALGORITHM)


def verify_signed_token(
    token: str,
    key: bytes,
    *,
    now: float | None = None,
    max_ttl: float = DEFAULT_MAX_TTL,
    audience: str | None = None,
    issuer: str | None = None,
) -> SignedClaims:
    """Check a signed token's signature and claims.

    Args:
        token: the bearer secret.
        key: the signing key's bytes; empty means signed tokens are off.
        now: the current Unix time (for tests); by default the clock.
        max_ttl: the longest a token may still live, seconds
            (``GATEWAY_SIGNING_MAX_TTL``; :data:`CLOCK_SLACK` more is allowed
            for the minter's clock); 0 is no maximum.
        audience: if given, the ``aud`` the token must carry (or list).
        issuer: if given, the ``iss`` the token must carry.

    Returns:
        The claims, once every check passed.

    Raises:
        Unauthorized: no key configured; not a JWT; another algorithm than
            HS256 (``none`` included); a wrong signature; ``exp`` or ``sub``
            missing or of the wrong type; ``exp`` not finite, or more than
            ``max_ttl`` ahead; expired (``now`` at or past ``exp``);
            ``scopes`` not a list of valid scope strings; ``aud`` or ``iss``
            other than the ``audience`` or ``issuer`` asked for; an ``info``
            that is not a JSON object of at most 1 KiB.
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
            options={
                "verify_exp": False,
                "verify_sub": False,
                # aud and iss are checked below, only when the gateway is bound.
                "verify_aud": False,
                "verify_iss": False,
                "require": ["exp", "sub"],
            },
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
    if not math.isfinite(exp):
        raise Unauthorized("signed token whose 'exp' is not a finite number")
    clock = time.time() if now is None else now
    if clock >= exp:
        raise Unauthorized("signed token expired")
    if max_ttl > 0 and exp - clock > max_ttl + CLOCK_SLACK:
        raise Unauthorized(
            f"signed token whose 'exp' is more than {max_ttl:g} s ahead (GATEWAY_SIGNING_MAX_TTL)"
        )
    _check_binding(claims, audience, issuer)
    try:
        sub = _check_subject(claims["sub"])
        scopes = parse_scopes(claims.get("scopes", []))
        info = check_info(claims.get("info"))
    except Invalid as exc:
        raise Unauthorized(f"signed token with bad claims: {exc.detail[:200]}") from None
    return SignedClaims(sub=sub, exp=float(exp), scopes=scopes, info=info)


def _check_binding(claims: dict[str, object], audience: str | None, issuer: str | None) -> None:
    """The token's ``aud``/``iss`` against the gateway's audience and issuer, when bound."""
    if audience is not None:
        aud = claims.get("aud")
        audiences = aud if isinstance(aud, list) else [aud]
        if audience not in [a for a in audiences if isinstance(a, str)]:
            raise Unauthorized(
                "signed token without this gateway's 'aud' (GATEWAY_SIGNING_AUDIENCE)"
            )
    if issuer is not None and claims.get("iss") != issuer:
        raise Unauthorized("signed token without this gateway's 'iss' (GATEWAY_SIGNING_ISSUER)")


def principal_for_claims(claims: SignedClaims) -> Principal:
    """The caller a signed token stands for: named ``signed:SUB``, with its scopes and expiry."""
    return Principal.from_scopes(
        f"signed:{claims.sub}",
        claims.scopes,
        subject=claims.sub,
        expires_at=claims.exp,
        info=claims.info,
    )
