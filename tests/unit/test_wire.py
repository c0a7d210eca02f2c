"""The wire: each spliced fast path equals ``orjson.dumps`` of its typed frame.

The hot frames are built by splicing strings (gateway's wire module, module
docstring); these tests pin each splice to the typed record it stands for,
byte for byte where the splice is orjson's own form, and as the same JSON
value where it writes ``expires_in`` with three decimals.
"""

from __future__ import annotations

import ast
import string
from pathlib import Path

import orjson
import pytest

from gateway.core.wire import (
    ACKED,
    AckedFrame,
    DeliverFrame,
    DeliveriesFrame,
    DeliveryItem,
    EnqueuedFrame,
    ErrorFrame,
    MessagesFrame,
    PublishedFrame,
    SubscribedFrame,
    TopicItem,
    encode_acked,
    encode_deliver,
    encode_deliveries,
    encode_enqueued,
    encode_entry,
    encode_error,
    encode_messages,
    encode_published,
    encode_subscribed,
)

ROOT = Path(__file__).resolve().parents[2]


def dumps(frame: object) -> str:
    return orjson.dumps(frame).decode()


@pytest.mark.parametrize("duplicate", [False, True])
def test_enqueued_splice_is_the_typed_frame(duplicate: bool) -> None:
    typed: EnqueuedFrame = {"op": "enqueued", "id": "12345", "duplicate": duplicate}
    assert encode_enqueued("12345", duplicate) == dumps(typed)


@pytest.mark.parametrize("ref", ["r-1", 7, 2.5, 2**70])
def test_replies_echo_the_ref_as_sent(ref: str | int | float) -> None:
    text = encode_enqueued("9", False, ref)
    assert orjson.loads(text) == {"op": "enqueued", "id": "9", "duplicate": False, "ref": ref}
    assert f'"ref":{orjson.dumps(ref).decode() if ref != 2**70 else ref}' in text


def test_acked_constant_is_the_typed_frame() -> None:
    typed: AckedFrame = {"op": "acked"}
    assert dumps(typed) == ACKED
    assert encode_acked() is ACKED
    assert orjson.loads(encode_acked("x")) == {"op": "acked", "ref": "x"}
    enqueued = encode_acked(None, [{"id": "3", "duplicate": True}])
    assert orjson.loads(enqueued) == {"op": "acked", "enqueued": [{"id": "3", "duplicate": True}]}


BODIES = ['{"a":[1,2.5,null],"b":"\\u00e9\\""}', "17", '"text"', "null"]


@pytest.mark.parametrize("body", BODIES)
@pytest.mark.parametrize(
    ("group", "priority"), [(None, 0), (None, -3), ("g-1", 0), ('odd "group" é', 100)]
)
def test_deliver_splice_is_the_typed_frame(body: str, group: str | None, priority: int) -> None:
    typed: DeliverFrame = {
        "op": "deliver",
        "queue": "jobs.v1",
        "id": "42",
        "receipt": "42.abc",
        "body": orjson.Fragment(body),
        "deliveries": 2,
        "expires_in": 29.999,
    }
    if group is not None or priority:
        typed["priority"] = priority
    if group is not None:
        typed["group"] = group
    spliced = encode_deliver("jobs.v1", "42", "42.abc", body, 2, 29.9994, group, priority)
    assert orjson.loads(spliced) == orjson.loads(dumps(typed))
    # The same keys in the same order: only the number's spelling differs.
    assert list(orjson.loads(spliced)) == list(typed)


def test_deliver_writes_expires_in_to_the_millisecond() -> None:
    for expires_in, written in [(30.0, "30.000"), (0.0004, "0.000"), (1.2345678, "1.235")]:
        spliced = encode_deliver("q", "1", "1.r", "1", 1, expires_in)
        assert f'"expires_in":{written}' in spliced
        assert orjson.loads(spliced)["expires_in"] == round(expires_in, 3)


def test_deliveries_splice_is_the_typed_frame() -> None:
    rows = [
        ("1", "1.a", BODIES[0], 1, 10.0, None, 0),
        ("2", "2.b", BODIES[1], 3, 0.5, "g", 5),
        ("3", "3.c", BODIES[2], 1, 0.25, None, -1),
    ]
    items: list[DeliveryItem] = []
    for msg_id, receipt, body, deliveries, expires_in, group, priority in rows:
        item: DeliveryItem = {
            "id": msg_id,
            "receipt": receipt,
            "body": orjson.Fragment(body),
            "deliveries": deliveries,
            "expires_in": expires_in,
        }
        if group is not None or priority:
            item["priority"] = priority
        if group is not None:
            item["group"] = group
        items.append(item)
    typed: DeliveriesFrame = {"op": "deliveries", "queue": "q", "items": items}
    spliced = encode_deliveries("q", rows)
    assert orjson.loads(spliced) == orjson.loads(dumps(typed))
    assert [list(i) for i in orjson.loads(spliced)["items"]] == [list(i) for i in items]


@pytest.mark.parametrize("dropped", [0, 17])
def test_messages_splice_is_the_typed_frame(dropped: int) -> None:
    entries = [(5, 100, b'{"k":"\\u2028"}'), (6, 101, b"[1,2]"), (7, 104, b'"x"')]
    items: list[TopicItem] = [
        {"seq": seq, "offset": offset, "body": orjson.Fragment(body)}
        for seq, offset, body in entries
    ]
    typed: MessagesFrame = {
        "op": "messages",
        "topic": "prices.eu",
        "items": items,
        "dropped": dropped,
    }
    spliced = encode_messages(
        "prices.eu", [(seq, encode_entry(offset, body)) for seq, offset, body in entries], dropped
    )
    assert spliced == dumps(typed)


def test_messages_with_no_items_is_the_typed_frame() -> None:
    typed: MessagesFrame = {"op": "messages", "topic": "t", "items": [], "dropped": 3}
    assert encode_messages("t", [], 3) == dumps(typed)


@pytest.mark.parametrize("recovered", [False, True])
def test_subscribed_splice_is_the_typed_frame(recovered: bool) -> None:
    typed: SubscribedFrame = {
        "op": "subscribed",
        "topic": "t-1",
        "epoch": "9f2c4e",
        "offset": 12,
        "recovered": recovered,
    }
    assert encode_subscribed("t-1", "9f2c4e", 12, recovered) == dumps(typed)


def test_published_and_errors_are_their_typed_frames() -> None:
    published: PublishedFrame = {
        "op": "published",
        "topic": "t",
        "seq": 4,
        "offset": 4,
        "epoch": "e",
        "ref": 1,
    }
    assert encode_published("t", 4, "e", 1) == dumps(published)
    error: ErrorFrame = {"op": "error", "code": "backpressure", "detail": "slow down"}
    assert encode_error("backpressure", "slow down") == dumps(error)
    limited = encode_error("backpressure", "slow down", "r", retry_after=0.12345)
    assert orjson.loads(limited) == {**error, "retry_after": 0.123, "ref": "r"}


def test_spliced_names_need_no_escaping() -> None:
    # Queue and topic names (NAME_RE), store ids and receipts, and epochs are
    # spliced between quotes as they are: true only if JSON writes each of
    # their characters as itself.
    for char in string.ascii_letters + string.digits + "._-":
        assert orjson.dumps(char) == f'"{char}"'.encode()


def _builds_a_frame(node: ast.AST) -> bool:
    """A dict with an "op" key, or an f-string that holds '"op":'."""
    if isinstance(node, ast.Dict):
        return any(isinstance(k, ast.Constant) and k.value == "op" for k in node.keys)
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.Constant) and '"op":' in str(v.value) for v in node.values)
    return False


#: The wire module itself, and the demo's misbehaving worker: a client of the
#: gateway, whose frames are the client's.
_NOT_THE_GATEWAYS = {"gateway/core/wire.py", "gateway/site/demo.py"}


def test_every_frame_is_built_in_the_wire_module() -> None:
    found = []
    for top in ("gateway", "consumers", "dashboard"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in _NOT_THE_GATEWAYS or "/migrations/" in rel:
                continue
            tree = ast.parse(path.read_text(), rel)
            found += [f"{rel}:{n.lineno}" for n in ast.walk(tree) if _builds_a_frame(n)]
    assert found == []
