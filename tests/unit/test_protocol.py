"""Frame parsing: every malformed frame maps to its protocol error code."""

from __future__ import annotations

import orjson
import pytest

from gateway.core.errors import ProtocolError
from gateway.core.protocol import (
    AckFrame,
    EnqueueFrame,
    ExtendFrame,
    Limits,
    NackFrame,
    decode_object,
    parse_frame,
)
from gateway.core.wire import encode_deliver

WORKER_OPS = frozenset({"ack", "nack", "reject", "extend", "enqueue"})
LIMITS = Limits(max_body_bytes=64)


def parse(text: str) -> object:
    return parse_frame(decode_object(text), WORKER_OPS, LIMITS)


def test_enqueue_keeps_canonical_body_and_defaults() -> None:
    frame = parse('{"op": "enqueue", "body": {"b": [1, 2.5, null]}, "ref": 7}')
    assert isinstance(frame, EnqueueFrame)
    assert frame.queue is None
    assert orjson.loads(frame.message.body_json) == {"b": [1, 2.5, None]}
    assert frame.message.delay == 0.0 and frame.message.key is None
    assert frame.ref == 7


def test_ack_with_follow_ups() -> None:
    frame = parse('{"op":"ack","receipt":"1.a","enqueue":[{"body":1},{"queue":"q2","body":2}]}')
    assert isinstance(frame, AckFrame)
    assert [q for q, _ in frame.follow_ups] == [None, "q2"]


def test_nack_and_extend_values() -> None:
    nack = parse('{"op":"nack","receipt":"r","delay":1.5}')
    assert isinstance(nack, NackFrame) and nack.delay == 1.5
    extend = parse('{"op":"extend","receipt":"r","timeout":60}')
    assert isinstance(extend, ExtendFrame) and extend.timeout == 60.0


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("not json", "bad_frame"),
        ("[1, 2]", "bad_frame"),
        ('"op"', "bad_frame"),
        ("{}", "bad_frame"),
        ('{"op": 5}', "bad_frame"),
        ('{"op": "dance"}', "unknown_op"),
        ('{"op": "publish", "topic": "t", "body": 1}', "unknown_op"),
        ('{"op": "enqueue"}', "bad_frame"),
        ('{"op": "enqueue", "body": 1, "delay": "soon"}', "bad_frame"),
        ('{"op": "enqueue", "body": 1, "delay": true}', "bad_frame"),
        ('{"op": "enqueue", "body": 1, "delay": -1}', "invalid"),
        ('{"op": "enqueue", "body": 1, "delay": 1e300}', "invalid"),
        ('{"op": "enqueue", "body": 1, "key": 5}', "bad_frame"),
        ('{"op": "enqueue", "body": 1, "key": ""}', "invalid"),
        ('{"op": "enqueue", "body": 1, "queue": "bad name"}', "invalid"),
        ('{"op": "enqueue", "body": 1, "queue": 3}', "bad_frame"),
        ('{"op": "enqueue", "body": 1, "ref": {"a": 1}}', "bad_frame"),
        ('{"op": "enqueue", "body": "' + "x" * 100 + '"}', "too_large"),
        ('{"op": "ack"}', "bad_frame"),
        ('{"op": "ack", "receipt": 12}', "bad_frame"),
        ('{"op": "ack", "receipt": "r", "enqueue": {}}', "bad_frame"),
        ('{"op": "ack", "receipt": "r", "enqueue": [{"body": 1, "delay": -2}]}', "invalid"),
        ('{"op": "ack", "receipt": "r", "enqueue": [5]}', "bad_frame"),
        ('{"op": "extend", "receipt": "r"}', "bad_frame"),
        ('{"op": "extend", "receipt": "r", "timeout": 0}', "invalid"),
        ('{"op": "extend", "receipt": "r", "timeout": 1e9}', "invalid"),
        ('{"op": "nack", "receipt": "r", "delay": -0.5}', "invalid"),
    ],
)
def test_malformed_frames_get_their_code(text: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse(text)
    assert info.value.code == code


def test_follow_up_errors_name_their_index() -> None:
    with pytest.raises(ProtocolError, match=r"enqueue\[1\]"):
        parse('{"op":"ack","receipt":"r","enqueue":[{"body":1},{"body":1,"delay":-1}]}')


def test_deliver_frame_splices_body_as_json() -> None:
    text = encode_deliver("q", "5", "5.a", '{"x":[1,"\\u00e9"]}', 2, 29.9994)
    frame = orjson.loads(text)
    assert frame == {
        "op": "deliver",
        "queue": "q",
        "id": "5",
        "receipt": "5.a",
        "body": {"x": [1, "é"]},
        "deliveries": 2,
        "expires_in": 29.999,
    }
