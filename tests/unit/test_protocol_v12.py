"""Protocol 1.2: a message with a field the gateway does not know is ``invalid``
wherever a message travels; other frames still ignore fields they do not use."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.core.errors import BadFrame, Invalid
from gateway.core.protocol import (
    AckFrame,
    EnqueueFrame,
    Limits,
    PublishFrame,
    decode_object,
    parse_enqueue_spec,
    parse_frame,
)

OPS = frozenset({"enqueue", "enqueue_many", "ack", "publish", "credit"})


def parse(frame: dict[str, Any]) -> Any:
    return parse_frame(decode_object(orjson.dumps(frame)), OPS, Limits())


@pytest.mark.parametrize(
    ("frame", "unknown"),
    [
        ({"op": "enqueue", "body": 1, "dealy": 5}, "dealy"),
        ({"op": "enqueue", "queue": "q", "ref": 7, "body": 1, "key": "k", "prio": 1}, "prio"),
        ({"op": "enqueue", "body": 1, "delay": None, "ttl": None, "Body": 2}, "Body"),
        ({"op": "enqueue_many", "messages": [{"body": 1}, {"body": 2, "dealy": 5}]}, "dealy"),
        ({"op": "enqueue_many", "messages": [{"body": 1, "queue": "q"}]}, "queue"),
        ({"op": "ack", "receipt": "1.ff", "enqueue": [{"body": 1, "dealy": 5}]}, "dealy"),
    ],
)
def test_a_message_with_an_unknown_field_is_invalid(frame: dict[str, Any], unknown: str) -> None:
    with pytest.raises(Invalid) as info:
        parse(frame)
    assert repr(unknown) in info.value.detail  # names the field
    known = info.value.detail.split("known fields: ")[1].split(", ")  # lists them
    assert {"body", "key", "delay", "group", "priority", "ttl"} <= set(known)


def test_every_known_field_is_taken() -> None:
    everything = {"body": 1, "key": "k", "delay": 1, "group": "g", "priority": 2, "ttl": 9}
    frame = parse({"op": "enqueue", "queue": "q", "ref": "r", **everything})
    assert isinstance(frame, EnqueueFrame) and frame.message.ttl == 9.0
    # The JavaScript client sends each follow-up with its op.
    ack = parse(
        {"op": "ack", "receipt": "1.ff", "enqueue": [{"op": "enqueue", "queue": "q", "body": 1}]}
    )
    assert isinstance(ack, AckFrame) and ack.follow_ups[0][0] == "q"
    spec = parse_enqueue_spec(everything, Limits())  # an HTTP or staged item
    assert (spec.key, spec.group, spec.priority) == ("k", "g", 2)
    with pytest.raises(Invalid, match="'op'"):
        parse_enqueue_spec({"op": "enqueue", **everything}, Limits())  # not in a list item


def test_other_frames_still_ignore_fields_they_do_not_use() -> None:
    publish = parse({"op": "publish", "topic": "t", "body": 1, "color": "red"})
    assert isinstance(publish, PublishFrame)
    ack = parse({"op": "ack", "receipt": "1.ff", "note": "x"})
    assert isinstance(ack, AckFrame)
    assert parse({"op": "credit", "n": 1, "extra": True}).n == 1


def test_a_missing_body_is_still_bad_frame() -> None:
    with pytest.raises(BadFrame, match="body"):
        parse({"op": "enqueue", "queue": "q"})
    with pytest.raises(BadFrame, match="body"):
        parse({"op": "enqueue", "queue": "q", "delay": 1})


def test_the_in_process_enqueue_refuses_unknown_fields_too() -> None:
    from gateway.host.producer import enqueue_many

    with pytest.raises(Invalid, match="'dealy'"):
        enqueue_many("q", [{"body": 1, "dealy": 5}])
