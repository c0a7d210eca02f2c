"""Token scopes: what a token may do, on which names (protocol: Authentication).

A scope is ``ACTION:PATTERN`` with ACTION one of ``enqueue``, ``consume``,
``publish``, ``subscribe``, or the bare word ``admin`` (everything) or
``metrics`` (``GET /metrics`` only). PATTERN is
a glob on queue or topic names where ``*`` matches any run of characters and
every other character matches itself. Pure: no Django.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from gateway.errors import Forbidden, Invalid

__all__ = ["ACTIONS", "MAX_SCOPES", "Action", "Grant", "Principal", "parse_scope", "parse_scopes"]

Action: TypeAlias = Literal["enqueue", "consume", "publish", "subscribe", "admin", "metrics"]
ACTIONS: frozenset[str] = frozenset({"enqueue", "consume", "publish", "subscribe"})
_PATTERN_RE = re.compile(r"[A-Za-z0-9._*-]{1,200}")
#: Most scopes one token may carry (a signed token's ``scopes`` claim is untrusted input).
MAX_SCOPES = 1000


@dataclass(frozen=True, slots=True)
class Grant:
    """One parsed scope: an action and the compiled name pattern."""

    action: str
    pattern: str
    regex: re.Pattern[str] = field(compare=False)

    def matches(self, action: str, name: str) -> bool:
        """True if this grant allows ``action`` on ``name``."""
        return self.action == action and self.regex.fullmatch(name) is not None


def parse_scope(scope: str) -> Grant | Literal["admin"]:
    """Parse one scope string.

    Raises:
        Invalid: an unknown action or a pattern with characters names cannot hold.
    """
    if scope == "admin":
        return "admin"
    if scope == "metrics":
        # Bare, like admin, but grants reading GET /metrics only.
        return Grant("metrics", "", re.compile(""))
    action, sep, pattern = scope.partition(":")
    if not sep or action not in ACTIONS:
        raise Invalid(
            f"scope {scope!r} must be 'admin' or ACTION:PATTERN with ACTION one of "
            + ", ".join(sorted(ACTIONS))
        )
    if _PATTERN_RE.fullmatch(pattern) is None:
        raise Invalid(f"scope pattern {pattern!r} may hold only [A-Za-z0-9._-] and '*'")
    regex = re.compile(".*".join(re.escape(part) for part in pattern.split("*")))
    return Grant(action, pattern, regex)


def parse_scopes(scopes: object) -> tuple[str, ...]:
    """Check a list of scope strings (a signed token's ``scopes`` claim) and return it.

    Raises:
        Invalid: not a list, more than :data:`MAX_SCOPES` items, an item that
            is not a string, or a string :func:`parse_scope` refuses.
    """
    if not isinstance(scopes, list):
        raise Invalid("scopes must be a list of scope strings")
    if len(scopes) > MAX_SCOPES:
        raise Invalid(f"at most {MAX_SCOPES} scopes")
    for scope in scopes:
        if not isinstance(scope, str):
            raise Invalid("scopes must be a list of scope strings")
        parse_scope(scope)
    return tuple(scopes)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's name and grants, or a staff user (admin)."""

    name: str
    grants: tuple[Grant, ...] = ()
    is_admin: bool = False
    token_id: int | None = None
    user_id: int | None = None  # a staff user's id (their actions go to the admin log)
    #: a signed token's ``sub`` (None for stored tokens and staff sessions)
    subject: str | None = None
    #: a signed token's ``exp``, Unix seconds (None: the principal does not expire)
    expires_at: float | None = None

    @classmethod
    def from_scopes(
        cls,
        name: str,
        scopes: list[str] | tuple[str, ...],
        token_id: int | None = None,
        *,
        subject: str | None = None,
        expires_at: float | None = None,
    ) -> Principal:
        """Build a principal from scope strings (validated on issue, or by :func:`parse_scopes`).

        Raises:
            Invalid: a scope :func:`parse_scope` refuses.
        """
        grants: list[Grant] = []
        admin = False
        for scope in scopes:
            parsed = parse_scope(scope)
            if parsed == "admin":
                admin = True
            else:
                grants.append(parsed)
        return cls(
            name=name,
            grants=tuple(grants),
            is_admin=admin,
            token_id=token_id,
            subject=subject,
            expires_at=expires_at,
        )

    def allows(self, action: Action, name: str = "") -> bool:
        """True if this principal may perform ``action`` on ``name``."""
        if self.is_admin:
            return True
        if action == "admin":
            return False
        return any(grant.matches(action, name) for grant in self.grants)

    def covers(self, other: Principal) -> bool:
        """True if this principal may do everything ``other`` may (a session
        socket's user, read again, against the rights the socket was opened with)."""
        if self.is_admin:
            return True
        if other.is_admin:
            return False
        mine = {(g.action, g.pattern) for g in self.grants}
        return all((g.action, g.pattern) in mine for g in other.grants)

    def require(self, action: Action, name: str = "") -> None:
        """Raise :class:`Forbidden` unless :meth:`allows`."""
        if not self.allows(action, name):
            what = f"{action} on {name!r}" if name else action
            raise Forbidden(f"token {self.name!r} has no scope for {what}")
