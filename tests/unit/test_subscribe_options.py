"""A subscription's options from a URL or a frame, and the presence info claim (pure cores)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.errors import BadFrame, Invalid
from gateway.core.fanout import Policy
from gateway.core.presence import MAX_INFO_BYTES, Member, check_info
from gateway.core.subscribe import SubscribeOptions, options_from_fields, options_from_query


def test_url_and_frame_give_the_same_options() -> None:
    query = {"capacity": "10", "on_full": "block", "priority": "3", "credit": "0"}
    fields: dict[str, Any] = {"capacity": 10, "on_full": "block", "priority": 3, "credit": 0}
    expected = SubscribeOptions(10, Policy.BLOCK, 3, 0)
    assert options_from_query(query) == options_from_fields(fields) == expected
    assert options_from_query({}) == options_from_fields({}) == SubscribeOptions()
    resume = options_from_fields({"since": 5, "epoch": "e1", "presence": True})
    assert (resume.since, resume.epoch, resume.presence, resume.resumes) == (5, "e1", True, True)
    latest = options_from_query({"recover": "latest", "presence": "true"})
    assert (latest.recover_latest, latest.presence, latest.resumes) == (True, True, True)


@pytest.mark.parametrize(
    ("fields", "error", "named"),
    [
        ({"capacity": 0}, Invalid, "capacity"),
        ({"capacity": 1_000_001}, Invalid, "capacity"),
        ({"capacity": "10"}, BadFrame, "capacity"),
        ({"capacity": True}, BadFrame, "capacity"),
        ({"on_full": "nope"}, Invalid, "on_full"),
        ({"priority": 0}, Invalid, "priority"),
        ({"credit": -1}, Invalid, "credit"),
        ({"since": 3}, Invalid, "since"),
        ({"epoch": "e"}, Invalid, "since"),
        ({"since": -1, "epoch": "e"}, Invalid, "since"),
        ({"since": 1, "epoch": ""}, Invalid, "epoch"),
        ({"recover": "oldest"}, Invalid, "recover"),
        ({"recover": "latest", "since": 1, "epoch": "e"}, Invalid, "recover"),
        ({"presence": "yes"}, BadFrame, "presence"),
    ],
)
def test_bad_options_are_refused_naming_them(
    fields: dict[str, Any], error: type[Exception], named: str
) -> None:
    with pytest.raises(error, match=named):
        options_from_fields(fields)


def test_bad_query_values_are_invalid() -> None:
    for query in ({"capacity": "ten"}, {"presence": "maybe"}, {"since": "1", "epoch": ""}):
        with pytest.raises(Invalid):
            options_from_query(query)


def test_info_claim_is_a_small_json_object() -> None:
    assert check_info(None) is None
    assert check_info({"name": "Ada", "seat": 3}) == '{"name":"Ada","seat":3}'
    for bad in (["a"], "text", 3, {"pad": "x" * MAX_INFO_BYTES}):
        with pytest.raises(Invalid):
            check_info(bad)


def test_members_round_trip_as_stored() -> None:
    member = Member("c1", "ada", '{"name":"Ada"}')
    assert Member.decode(member.encode()) == member
    assert member.as_json() == {"client": "c1", "user": "ada", "info": {"name": "Ada"}}
    with pytest.raises(ValueError):
        Member.decode(b'{"client": 1}')
