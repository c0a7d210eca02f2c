"""History reads from a topic's Redis stream (gateway.topics.streams).

A read (a resume's replay, ``GET /api/topics/T/history``, the first missed
message of a resume) asks Redis for a range of the stream packed into one
string by a Lua script, and unpacks it here. These tests write entries
straight into a stream on the machine's Redis, the way the append script
does and otherwise, and check that a read gives back exactly what XRANGE
holds: offsets, bodies byte for byte (any byte, the separators included),
publish times, the range and the limit.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis

from gateway.core.history import Entry
from gateway.topics.settings import TopicSettingsCache
from gateway.topics.streams import RedisTopics, unpack_entries

BODIES = [
    b'{"m":1}',
    b"",
    b'"a:b,c;12,3.5,7:"',
    "\u00e9t\u00e9 \u2713".encode(),
    b"\x00\xff\r\n:,",
    b"[" + b"1," * 50_000 + b"1]",
]


@pytest.fixture
async def topics(redis_url: str) -> AsyncIterator[RedisTopics]:
    prefix = f"lctest{uuid.uuid4().hex[:8]}"
    shared = RedisTopics(redis_url, settings=TopicSettingsCache(load=dict), prefix=prefix)
    try:
        yield shared
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        await shared.close()


def _stream(topics: RedisTopics, topic: str) -> str:
    return f"{topics.prefix}:topic:{topic}:stream"


def _xadd_all(redis_url: str, key: str, first: int, bodies: list[bytes], at: float) -> None:
    client = redis.Redis.from_url(redis_url)
    for i, body in enumerate(bodies):
        client.xadd(key, {"b": body, "t": repr(at + i)}, id=f"0-{first + i}")


async def test_a_read_gives_back_every_body_byte_for_byte_with_its_offset_and_time(
    topics: RedisTopics, redis_url: str
) -> None:
    _xadd_all(redis_url, _stream(topics, "t1"), 1, BODIES, 1_700_000_000.25)
    got = await topics.read("t1", 0, 100)
    assert got == [Entry(1 + i, body, 1_700_000_000.25 + i) for i, body in enumerate(BODIES)]
    assert all(type(e.body) is bytes for e in got)


async def test_a_read_starts_after_the_offset_and_stops_at_the_limit(
    topics: RedisTopics, redis_url: str
) -> None:
    bodies = [b"%d" % i for i in range(1, 2501)]
    _xadd_all(redis_url, _stream(topics, "t2"), 1, bodies, 1_700_000_000.0)
    got = await topics.read("t2", 1000, 1000)
    assert [e.offset for e in got] == list(range(1001, 2001))
    assert [e.body for e in got] == bodies[1000:2000]
    assert [e.offset for e in await topics.read("t2", 2400, 1000)] == list(range(2401, 2501))
    assert await topics.read("t2", 2500, 1000) == []
    assert await topics.read("never-written", 0, 10) == []


async def test_a_trimmed_stream_is_read_from_what_it_still_holds(
    topics: RedisTopics, redis_url: str
) -> None:
    key = _stream(topics, "t3")
    _xadd_all(redis_url, key, 1, [b"%d" % i for i in range(1, 101)], 1_700_000_000.0)
    redis.Redis.from_url(redis_url).xtrim(key, maxlen=10, approximate=False)
    got = await topics.read("t3", 5, 1000)
    assert [e.offset for e in got] == list(range(91, 101))


async def test_fields_in_either_order_are_read_alike(topics: RedisTopics, redis_url: str) -> None:
    key = _stream(topics, "t4")
    client = redis.Redis.from_url(redis_url)
    client.xadd(key, {"t": "1700000000.5", "b": b"tb"}, id="0-1")
    client.xadd(key, {"b": b"bt", "t": "1700000001.5"}, id="0-2")
    assert await topics.read("t4", 0, 10) == [
        Entry(1, b"tb", 1_700_000_000.5),
        Entry(2, b"bt", 1_700_000_001.5),
    ]


async def test_what_the_append_script_wrote_is_read_back(topics: RedisTopics) -> None:
    head = await topics.head("t5")
    topics.start(_deliver_nothing, lambda topic: None, lambda topic: None)
    published = await topics.append("t5", [b'{"n":1}', b'{"n":2}'])
    assert published.epoch == head.epoch and published.offset == 2
    got = await topics.read("t5", 0, 10)
    assert [(e.offset, e.body) for e in got] == [(1, b'{"n":1}'), (2, b'{"n":2}')]


async def _deliver_nothing(topic: str, entries: list[Entry], gone_to: int) -> None:
    return None


def test_unpacking_refuses_what_is_not_a_packed_range() -> None:
    assert unpack_entries(b"") == []
    assert unpack_entries(b"7,1.5,3:abc") == [Entry(7, b"abc", 1.5)]
    with pytest.raises(ValueError):
        unpack_entries(b"7,1.5,3")  # no body
    with pytest.raises(ValueError):
        unpack_entries(b"7,1.5,9:abc")  # cut short


async def test_the_reader_delivers_a_backlog_and_then_what_comes_in_offset_order(
    topics: RedisTopics, redis_url: str
) -> None:
    key = _stream(topics, "t6")
    _xadd_all(redis_url, key, 1, [b"%d" % i for i in range(1, 2501)], 1_700_000_000.0)
    delivered: list[tuple[int, bytes]] = []
    gone: list[int] = []
    done = asyncio.Event()

    async def deliver(topic: str, entries: list[Entry], gone_to: int) -> None:
        assert topic == "t6"
        delivered.extend((e.offset, e.body) for e in entries)
        gone.append(gone_to)
        if delivered[-1][0] >= 2600:
            done.set()

    topics.start(deliver, lambda topic: None, lambda topic: None)
    topics.follow("t6", 0)  # a backlog of 2,500: read packed, 1,000 at a time
    await asyncio.sleep(0.3)  # then nothing new: the reader waits in XREAD
    _xadd_all(redis_url, key, 2501, [b"%d" % i for i in range(2501, 2601)], 1_700_000_100.0)
    await asyncio.wait_for(done.wait(), 10)
    assert delivered == [(i, b"%d" % i) for i in range(1, 2601)]
    assert set(gone) == {0}


async def test_the_reader_tells_what_was_trimmed_before_it_read_it(
    topics: RedisTopics, redis_url: str
) -> None:
    key = _stream(topics, "t7")
    _xadd_all(redis_url, key, 1, [b"%d" % i for i in range(1, 101)], 1_700_000_000.0)
    redis.Redis.from_url(redis_url).xtrim(key, maxlen=10, approximate=False)
    got: list[tuple[list[int], int]] = []
    done = asyncio.Event()

    async def deliver(topic: str, entries: list[Entry], gone_to: int) -> None:
        got.append(([e.offset for e in entries], gone_to))
        done.set()

    topics.start(deliver, lambda topic: None, lambda topic: None)
    topics.follow("t7", 5)
    await asyncio.wait_for(done.wait(), 10)
    assert got[0] == (list(range(91, 101)), 90)
