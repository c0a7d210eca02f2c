"""A topic whose hash was made on another Redis master gets a new epoch (issue 27.3).

After a failover, the promoted replica holds each topic's hash as the old
master last sent it, possibly without its last publishes, and with the old
master's replication id in ``m`` (gateway.topics.streams). These tests put a hash in
that state on the machine's Redis (no namespaces, no Sentinel: they run
wherever Redis does; tests/cluster/test_redis_failover.py does the real
failover on separate hosts) and check what two gateway processes do with it.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
import redis

from tests.support.clients import Socket, unique
from tests.support.gateways import gateways_on_redis

CLOSE_NEW_EPOCH = 4409


def _meta(env: dict[str, str], topic: str) -> str:
    return f"{env['GATEWAY_REDIS_PREFIX']}:topic:{topic}:meta"


async def test_a_hash_made_on_a_replaced_master_is_a_new_epoch_and_its_subscribers_are_told(
    redis_url: str,
) -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-replaced-"))
    with gateways_on_redis(var, redis_url) as (a, b, token):
        topic = unique("replaced")
        sub = await Socket.open(f"{b.ws}/ws/topics/{topic}/", token)
        await asyncio.sleep(0.5)  # B follows the topic
        async with await Socket.open(f"{a.ws}/ws/produce/", token) as p:
            first = await p.request({"op": "publish", "topic": topic, "body": 1})
            assert first["op"] == "published", first
            frame = await sub.next()
            assert [item["body"] for item in frame["items"]] == [1], frame
            # What a promoted replica shows: the hash, made on another master.
            client = redis.Redis.from_url(redis_url)
            try:
                client.hset(_meta(a.env, topic), "m", "0" * 40)
            finally:
                client.close()
            # B's reader sees it (its check runs every second): the socket is told.
            with pytest.raises(ConnectionError):
                while True:
                    frame = await sub.next(timeout=10)
                    raise AssertionError(f"a message after the master changed: {frame}")
            assert sub.conn.close_code == CLOSE_NEW_EPOCH
            second = await p.request({"op": "publish", "topic": topic, "body": 2})
            assert second["op"] == "published", second
            assert second["epoch"] != first["epoch"] and second["offset"] == 1, second
        since = f"since={first['offset']}&epoch={first['epoch']}"
        async with await Socket.open(f"{b.ws}/ws/topics/{topic}/?{since}", token) as again:
            told = await again.next()
            assert told["op"] == "subscribed", told
            assert (told["recovered"], told["epoch"]) == (False, second["epoch"]), told


async def test_a_hash_of_an_earlier_version_keeps_its_epoch_and_adopts_the_master(
    redis_url: str,
) -> None:
    """A hash without ``m`` (written before it existed) is not a lost one."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-adopt-"))
    with gateways_on_redis(var, redis_url) as (a, _b, token):
        topic = unique("adopt")
        async with await Socket.open(f"{a.ws}/ws/produce/", token) as p:
            first = await p.request({"op": "publish", "topic": topic, "body": 1})
            client = redis.Redis.from_url(redis_url)
            try:
                made_on = client.hget(_meta(a.env, topic), "m")
                client.hdel(_meta(a.env, topic), "m")
                second = await p.request({"op": "publish", "topic": topic, "body": 2})
                assert (second["epoch"], second["offset"]) == (first["epoch"], 2), second
                assert client.hget(_meta(a.env, topic), "m") == made_on
            finally:
                client.close()
