"""Token scopes: globs on names, per action."""

from __future__ import annotations

from fnmatch import fnmatchcase

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import Forbidden, Invalid
from gateway.core.scopes import Glob, Principal, parse_scope


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


# -- globs in linear time (issue 22.10)


@settings(max_examples=2000, deadline=None)
@given(
    pattern=st.text(alphabet="ab.*", min_size=1, max_size=12),
    name=st.text(alphabet="ab.", max_size=16),
)
def test_glob_agrees_with_fnmatch_on_the_scope_syntax(pattern: str, name: str) -> None:
    # Scope patterns hold [A-Za-z0-9._-] and '*': none of fnmatch's other
    # specials ('?', '['), so fnmatch's meaning of '*' is the reference.
    assert Glob(pattern).match(name) == fnmatchcase(name, pattern)


@pytest.mark.parametrize(
    ("pattern", "name"),
    [
        ("*a*a*a*a*a*a*b", "a" * 60),  # 2.3 s on the event loop as a regular expression
        ("*a" * 99 + "*b", "a" * 200),
        ("a*" * 99 + "b", "a" * 200),
        ("*" + "ab" * 50 + "*c", "ab" * 100),
        # Head and tail fit; the middle pieces are searched and never found.
        ("a*" + "aab*" * 30 + "b", "a" * 199 + "b"),
    ],
)
def test_a_pathological_glob_takes_steps_bounded_by_the_names_length(
    pattern: str, name: str
) -> None:
    glob = Glob(pattern)
    steps = [0]
    assert glob.match(name, steps) is False
    # Each character of the name is passed over at most once, plus one step
    # per piece of the pattern: no backtracking.
    assert steps[0] <= len(name) + pattern.count("*") + 1, steps[0]


def test_a_matching_glob_takes_bounded_steps_too() -> None:
    steps = [0]
    assert Glob("*a*a*a*a*a*a*b").match("a" * 59 + "b", steps)
    assert steps[0] <= 60 + 7


def test_grants_match_through_the_linear_glob() -> None:
    grant = parse_scope("subscribe:*a*a*a*a*a*a*b")
    assert not isinstance(grant, str)
    assert not grant.matches("subscribe", "a" * 60)
    assert grant.matches("subscribe", "xaxaxaxaxaxaxb")
    assert not grant.matches("publish", "xaxaxaxaxaxaxb")
