"""Token scopes: globs on names, per action."""

from __future__ import annotations

import pytest

from gateway.errors import Forbidden, Invalid
from gateway.scopes import Principal, parse_scope


def test_glob_matches_any_run_and_nothing_else() -> None:
    p = Principal.from_scopes("t", ["consume:emails.*", "enqueue:jobs"])
    assert p.allows("consume", "emails.welcome")
    assert p.allows("consume", "emails.")
    assert not p.allows("consume", "emails")
    assert not p.allows("consume", "xemails.a")
    assert p.allows("enqueue", "jobs")
    assert not p.allows("enqueue", "jobs2")
    assert not p.allows("enqueue", "emails.welcome")  # scope is per action
    assert not p.allows("admin")


def test_dot_is_literal_not_regex() -> None:
    p = Principal.from_scopes("t", ["publish:a.b"])
    assert p.allows("publish", "a.b")
    assert not p.allows("publish", "aXb")


def test_admin_allows_everything() -> None:
    p = Principal.from_scopes("t", ["admin"])
    assert p.allows("subscribe", "anything")
    assert p.allows("admin")


def test_require_raises_forbidden_naming_the_operation() -> None:
    p = Principal.from_scopes("t", ["consume:a"])
    with pytest.raises(Forbidden, match="enqueue on 'a'"):
        p.require("enqueue", "a")


@pytest.mark.parametrize("scope", ["", "consume", "read:x", "consume:", "consume:a b", "admin:x"])
def test_bad_scopes_are_refused(scope: str) -> None:
    with pytest.raises(Invalid):
        parse_scope(scope)
