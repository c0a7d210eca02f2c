"""Tokens: a fixed string, or a callable that returns a fresh one (signed tokens).

A signed token (protocol 1.1, "Signed connection tokens and token lifetime")
is a JWT with an ``exp``. The client reads ``exp`` without verifying the
signature (it has no key, and needs none: the gateway verifies) to know when
to send ``{"op": "refresh", "token": NEW}`` on an open socket, and asks the
callable for a new token before each connection and each refresh.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeAlias

import orjson

__all__ = ["TokenLike", "TokenSource", "jwt_expiry", "refresh_delay"]

#: What ``token=`` takes: the token, or a function (sync or async) returning one.
TokenLike: TypeAlias = str | Callable[[], str | Awaitable[str]]

#: Refresh this long before ``exp`` (halfway through a lifetime shorter than
#: twice this): room for a slow token callable and a slow round trip.
REFRESH_MARGIN = 30.0


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim of a JWT (Unix seconds), read without verifying it.

    Returns:
        ``exp`` as a float, or None when ``token`` is not a JWT with a numeric
        ``exp`` (a stored token, ``lc_...``, never expires on its own).
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return float(exp)


def refresh_delay(expires_in: float, margin: float = REFRESH_MARGIN) -> float:
    """Seconds to wait before refreshing a token that expires in ``expires_in``.

    ``margin`` seconds before expiry, or halfway through the remaining
    lifetime if that is later (a 3600 s token refreshes after 3570 s, a 40 s
    one after 20 s): few refreshes, and always time left for one to finish.
    Never negative.
    """
    return max(0.0, expires_in - margin, expires_in / 2)


class TokenSource:
    """Hands out the current token: the fixed string, or the callable's answer.

    Args:
        token: a token, or a function (plain or ``async``) returning a fresh one.
    """

    def __init__(self, token: TokenLike) -> None:
        if not isinstance(token, str) and not callable(token):
            raise TypeError(f"token must be a string or a callable, not {type(token).__name__}")
        self._token = token

    @property
    def renewable(self) -> bool:
        """True when a fresh token can be asked for (a callable was given)."""
        return not isinstance(self._token, str)

    async def get(self) -> str:
        """The token to use now (calls the callable, awaiting it if it is async).

        Raises:
            TypeError: the callable returned something that is not a string.
        """
        if isinstance(self._token, str):
            return self._token
        value = self._token()
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, str):
            raise TypeError(f"the token callable returned {type(value).__name__}, not str")
        return value


def seconds_left(token: str, now: float | None = None) -> float | None:
    """Seconds until ``token`` expires (its JWT ``exp``), or None if it has none."""
    exp = jwt_expiry(token)
    if exp is None:
        return None
    return exp - (time.time() if now is None else now)
