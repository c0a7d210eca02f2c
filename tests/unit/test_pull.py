"""gateway.core.pull: the HTTP workers' requests and receipts (protocol 1.2, pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.errors import Invalid
from gateway.core.leases import format_receipt
from gateway.core.pull import (
    LeaseRequest,
    http_receipt,
    parse_end,
    parse_lease,
    split_http_receipt,
    store_receipt,
)


def test_lease_defaults_and_bounds() -> None:
    assert parse_lease({}) == LeaseRequest(1, 0.0, None)
    assert parse_lease({"max": 100, "wait": 20, "visibility_timeout": 0.5}) == LeaseRequest(
        100, 20.0, 0.5
    )
    assert parse_lease({"wait": None, "visibility_timeout": None}) == LeaseRequest()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"max": 0}, "max"),
        ({"max": 101}, "max"),
        ({"max": True}, "max"),
        ({"max": 2.0}, "max"),
        ({"wait": 20.001}, "wait"),
        ({"wait": -0.1}, "wait"),
        ({"wait": float("nan")}, "wait"),
        ({"wait": False}, "wait"),
        ({"visibility_timeout": 0}, "visibility_timeout"),
        ({"visibility_timeout": 43201}, "visibility_timeout"),
        ({"max": 1, "prefetch": 5}, "'prefetch'"),
    ],
)
def test_bad_lease_requests_name_the_field(body: dict[str, Any], named: str) -> None:
    with pytest.raises(Invalid, match=named):
        parse_lease(body)


def test_http_receipts_name_their_queue() -> None:
    inner = format_receipt(42, 0xABC)
    mine = http_receipt("emails", inner)
    assert mine.startswith("h") and mine.endswith(inner)
    assert store_receipt("emails", mine) == inner
    assert store_receipt("orders", mine) is None  # another queue's
    assert store_receipt("emails", inner) is None  # a socket's
    assert split_http_receipt(mine) is not None
    for bad in ("h", "h1.2.3", "hzzzzzzzz.", "hzzzzzzzz.1", mine + "x", "x" + mine):
        assert split_http_receipt(bad) is None, bad


def test_ending_requests_sort_receipts() -> None:
    a, b = http_receipt("q", format_receipt(1, 1)), http_receipt("q", format_receipt(2, 2))
    socket_receipt = format_receipt(3, 3)
    elsewhere = http_receipt("other", format_receipt(4, 4))
    asked = parse_end("ack", "q", {"receipts": [a, socket_receipt, a, elsewhere, b, elsewhere]})
    assert asked.receipts == {a: format_receipt(1, 1), b: format_receipt(2, 2)}
    assert asked.foreign == [socket_receipt, elsewhere]
    assert parse_end("nack", "q", {"receipts": [a]}).delay == 0.0
    assert parse_end("nack", "q", {"receipts": [a], "delay": 2.5}).delay == 2.5
    assert parse_end("extend", "q", {"receipts": [a], "timeout": 60}).timeout == 60.0


@pytest.mark.parametrize(
    ("action", "body", "named"),
    [
        ("ack", {}, "receipts"),
        ("ack", {"receipts": []}, "receipts"),
        ("ack", {"receipts": "h"}, "receipts"),
        ("ack", {"receipts": ["x"] * 1001}, "receipts"),
        ("ack", {"receipts": ["nope"]}, r"receipts\[0\]"),
        ("ack", {"receipts": [None]}, r"receipts\[0\]"),
        ("reject", {"receipts": ["1.a", 5]}, r"receipts\[1\]"),
        ("ack", {"receipts": ["1.a"], "timeout": 5}, "'timeout'"),
        ("nack", {"receipts": ["1.a"], "delay": -1}, "delay"),
        ("nack", {"receipts": ["1.a"], "delay": "1"}, "delay"),
        ("extend", {"receipts": ["1.a"]}, "timeout"),
        ("extend", {"receipts": ["1.a"], "timeout": 0}, "timeout"),
        ("extend", {"receipts": ["1.a"], "timeout": 43201}, "timeout"),
    ],
)
def test_bad_ending_requests_name_the_problem(
    action: str, body: dict[str, Any], named: str
) -> None:
    with pytest.raises(Invalid, match=named):
        parse_end(action, "q", body)
