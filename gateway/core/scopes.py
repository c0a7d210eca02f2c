"""Token scopes: what a token may do, on which names (protocol: Authentication).

A scope is ``ACTION:PATTERN`` with ACTION one of ``enqueue``, ``consume``,
``publish``, ``subscribe``, or the bare word ``admin`` (everything) or
``metrics`` (``GET /metrics`` only). PATTERN is
a glob on queue or topic names where ``*`` matches any run of characters and
every other character matches itself. Pure: no Django.

Operator rights (protocol 1.2, "Staff is not enough"): ``view_queue``
(reading stats, browse, presence, metrics, schedules, the dashboard),
``change_queue`` (acting on queues, messages and schedules) and
``change_topic`` (topic settings), named after the Django permissions that
give them to a staff user's session (:func:`operator_principal`). An
``admin`` token or a superuser has them all; no other token has any. Every
active staff session, with or without them, may enqueue, consume, publish
and subscribe on any name, as a client.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from gateway.core.errors import Forbidden, Invalid

__all__ = [
    "ACTIONS",
    "MAX_SCOPES",
    "OPERATOR_RIGHTS",
    "Action",
    "Grant",
    "OperatorRight",
    "Principal",
    "operator_principal",
    "parse_scope",
    "parse_scopes",
]

OperatorRight: TypeAlias = Literal["view_queue", "change_queue", "change_topic"]
OPERATOR_RIGHTS: frozenset[str] = frozenset({"view_queue", "change_queue", "change_topic"})
Action: TypeAlias = (
    Literal["enqueue", "consume", "publish", "subscribe", "admin", "metrics"] | OperatorRight
)
ACTIONS: frozenset[str] = frozenset({"enqueue", "consume", "publish", "subscribe"})
_PATTERN_RE = re.compile(r"[A-Za-z0-9._*-]{1,200}")
#: Most scopes one token may carry (a signed token's ``scopes`` claim is untrusted input).
MAX_SCOPES = 1000


class Glob:
    """A scope pattern, matched in time linear in the name's length.

    ``*`` matches any run of characters (none included) and every other
    character matches itself, as :func:`fnmatch.fnmatchcase` reads the
    characters scopes allow. A regular expression made of the pattern
    (``.*a.*a.*b``) backtracks: ``*a*a*a*a*a*a*b`` against a 60-character
    name took 2.3 s of the event loop. Here the name must start with the
    piece before the first star and end with the piece after the last; the
    pieces between are found left to right, each after the one before,
    never looking back. The leftmost place of each piece leaves the most
    room to the ones after it, so if any placement fits, this one does.
    """

    __slots__ = ("_head", "_middle", "_tail", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        parts = pattern.split("*")
        self._head = parts[0]
        self._tail: str | None = parts[-1] if len(parts) > 1 else None
        self._middle = tuple(part for part in parts[1:-1] if part)

    def match(self, name: str, steps: list[int] | None = None) -> bool:
        """Does ``name`` match, as a whole?

        Args:
            name: a queue or topic name.
            steps: if given, ``steps[0]`` is increased by the characters of
                the name passed over and one per piece searched (tests: it
                stays within the name's length plus the pieces).
        """
        head, tail = self._head, self._tail
        if tail is None:
            return name == head
        end = len(name) - len(tail)
        if end < len(head) or not name.startswith(head) or not name.endswith(tail):
            return False
        position = len(head)
        for piece in self._middle:
            found = name.find(piece, position, end)
            if steps is not None:
                steps[0] += 1 + ((found + len(piece)) if found >= 0 else end) - position
            if found < 0:
                return False
            position = found + len(piece)
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Glob) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def __repr__(self) -> str:
        return f"Glob({self.pattern!r})"


@dataclass(frozen=True, slots=True)
class Grant:
    """One parsed scope: an action and the compiled name pattern."""

    action: str
    pattern: str
    glob: Glob = field(compare=False)

    def matches(self, action: str, name: str) -> bool:
        """True if this grant allows ``action`` on ``name``."""
        return self.action == action and self.glob.match(name)


def parse_scope(scope: str) -> Grant | Literal["admin"]:
    """Parse one scope string.

    Raises:
        Invalid: an unknown action or a pattern with characters names cannot hold.
    """
    if scope == "admin":
        return "admin"
    if scope == "metrics":
        # Bare, like admin, but grants reading GET /metrics only.
        return Grant("metrics", "", Glob(""))
    action, sep, pattern = scope.partition(":")
    if not sep or action not in ACTIONS:
        raise Invalid(
            f"scope {scope!r} must be 'admin' or ACTION:PATTERN with ACTION one of "
            + ", ".join(sorted(ACTIONS))
        )
    if _PATTERN_RE.fullmatch(pattern) is None:
        raise Invalid(f"scope pattern {pattern!r} may hold only [A-Za-z0-9._-] and '*'")
    return Grant(action, pattern, Glob(pattern))


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
    #: a staff session's operator rights (:data:`OPERATOR_RIGHTS`; an admin has them all)
    operator: frozenset[str] = frozenset()
    #: a signed token's ``info`` claim as compact JSON text (presence), or None
    info: str | None = None

    @classmethod
    def from_scopes(
        cls,
        name: str,
        scopes: list[str] | tuple[str, ...],
        token_id: int | None = None,
        *,
        subject: str | None = None,
        expires_at: float | None = None,
        info: str | None = None,
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
            info=info,
        )

    def allows(self, action: Action, name: str = "") -> bool:
        """True if this principal may perform ``action`` on ``name``."""
        if self.is_admin:
            return True
        if action in OPERATOR_RIGHTS:
            return action in self.operator
        if action == "admin":
            return False
        return any(grant.matches(action, name) for grant in self.grants)

    def covers(self, other: Principal) -> bool:
        """True if this principal may do everything ``other`` may (a session
        socket's user, read again, against the rights the socket was opened with)."""
        if self.is_admin:
            return True
        if other.is_admin or not other.operator <= self.operator:
            return False
        mine = {(g.action, g.pattern) for g in self.grants}
        return all((g.action, g.pattern) in mine for g in other.grants)

    def require_operator(self, right: OperatorRight, action: Action, name: str) -> None:
        """Raise :class:`Forbidden` unless this may do an operator action that a
        token may also do with scope ``action`` on ``name`` (browsing with
        ``consume``, cancelling with ``enqueue``, ...).

        A staff session needs ``right`` itself: its client scopes (every
        session may enqueue, consume, publish and subscribe) do not make it an
        operator.
        """
        if self.user_id is None and self.allows(action, name):
            return
        self.require(right)

    def require(self, action: Action, name: str = "") -> None:
        """Raise :class:`Forbidden` unless :meth:`allows`."""
        if not self.allows(action, name):
            if action in OPERATOR_RIGHTS:
                raise Forbidden(
                    f"{self.name!r} may not do this: it needs the 'admin' scope, or a "
                    f"superuser, or a staff user with the permission gateway.{action}"
                )
            what = f"{action} on {name!r}" if name else action
            raise Forbidden(f"token {self.name!r} has no scope for {what}")


#: What every active staff session may do, whatever its permissions: the
#: work of a client (enqueue, consume, publish, subscribe on any name). The
#: contract lets staff sessions use every endpoint and takes only operator
#: actions away from staff without the matching permission.
_SESSION_BASE_SCOPES: tuple[str, ...] = ("enqueue:*", "consume:*", "publish:*", "subscribe:*")
#: What an operator right adds to that besides operator actions: the
#: ``/metrics`` page is reading.
_SESSION_SCOPES: dict[str, tuple[str, ...]] = {
    "view_queue": ("metrics",),
    "change_queue": (),
    "change_topic": (),
}


def operator_principal(
    username: str, user_id: int, *, superuser: bool, permissions: set[str]
) -> Principal:
    """The principal of an active staff user's session.

    Args:
        username: the user's name (the principal is ``staff:USERNAME``).
        user_id: the user's primary key (their actions go to the admin log).
        superuser: a superuser may do everything, as an ``admin`` token.
        permissions: the user's permission codenames in the ``gateway`` app
            (``view_queue``, ...); others are ignored.
    """
    name = f"staff:{username}"
    if superuser:
        return Principal(name=name, is_admin=True, user_id=user_id)
    rights = set(OPERATOR_RIGHTS & permissions)
    if "change_queue" in rights:
        rights.add("view_queue")
    scopes = [
        *_SESSION_BASE_SCOPES,
        *(scope for right in sorted(rights) for scope in _SESSION_SCOPES[right]),
    ]
    principal = Principal.from_scopes(name, scopes)
    return Principal(
        name=name, grants=principal.grants, user_id=user_id, operator=frozenset(rights)
    )
