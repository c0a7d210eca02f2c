"""REDIS_URL with Sentinel: redis+sentinel://SENTINELS/MASTER[/DB] (issue 27.3)."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import SentinelConnectionPool

from gateway.topics.redis_url import (
    SentinelTarget,
    async_client,
    layer_host,
    parse_sentinel_url,
    sync_client,
)


def test_a_sentinel_url_names_its_sentinels_master_database_and_password() -> None:
    target = parse_sentinel_url("redis+sentinel://:p%40ss@10.0.0.1:26379,s2,[::1]:26380/main/3")
    assert target == SentinelTarget(
        sentinels=(("10.0.0.1", 26379), ("s2", 26379), ("::1", 26380)),
        master="main",
        db=3,
        password="p@ss",
    )
    assert target.master_kwargs() == {"db": 3, "password": "p@ss"}


def test_other_urls_are_not_sentinel_urls() -> None:
    assert parse_sentinel_url("redis://127.0.0.1:6379/0") is None
    assert layer_host("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel:///main",
        "redis+sentinel://s1:notaport/main",
        "redis+sentinel://s1:26379",
        "redis+sentinel://s1:26379/main/x",
        "redis+sentinel://s1:26379/main/0/extra",
    ],
)
def test_a_bad_sentinel_url_is_refused_with_a_clear_error(url: str) -> None:
    with pytest.raises(ValueError, match="REDIS_URL"):
        parse_sentinel_url(url)


async def test_clients_of_a_sentinel_url_ask_the_sentinels_for_the_master() -> None:
    url = "redis+sentinel://s1:26379,s2:26380/main/2"
    client = async_client(url, max_connections=4, wait=5)
    try:
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert isinstance(pool, aioredis.BlockingConnectionPool)  # waits, never "too many"
        assert pool.service_name == "main" and pool.connection_kwargs["db"] == 2
        assert pool.sentinel_manager.sentinel_kwargs["retry"].get_retries() == 0
    finally:
        await client.aclose()
    blocking = sync_client(url, socket_timeout=3)
    assert isinstance(blocking, redis.Redis)
    assert blocking.connection_pool.service_name == "main"  # type: ignore[attr-defined]
    host = layer_host(url)
    assert isinstance(host, dict)
    assert (host["sentinels"], host["master_name"], host["db"]) == (
        [["s1", 26379], ["s2", 26380]],
        "main",
        2,
    )
    # A Sentinel that does not answer is passed over at once, not retried for seconds.
    assert host["sentinel_kwargs"]["retry"].get_retries() == 0
