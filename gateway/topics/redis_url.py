"""``REDIS_URL`` to Redis clients, a master found through Sentinel included.

Besides ``redis://`` and ``rediss://`` URLs, ``REDIS_URL`` may name the
Sentinels that watch a master and the master's name::

    redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]

Every client the gateway makes (the topic streams, the metrics' share, the
channel layer) then asks the Sentinels where the master is, and asks again
when a connection fails or the server it reaches has become a replica, so
the gateway follows a failover by itself (docs/operations.md, "Redis with a
replica and Sentinel"). The password, if any, is the master's; the Sentinels
are reached without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

__all__ = ["SentinelTarget", "async_client", "layer_host", "parse_sentinel_url", "sync_client"]

SENTINEL_SCHEME = "redis+sentinel"
#: How long a question to one Sentinel may take before the next one is asked.
SENTINEL_TIMEOUT = 1.0


def sentinel_kwargs() -> dict[str, Any]:
    """How the gateway's clients talk to the Sentinels themselves: a Sentinel
    that does not answer is passed over at once for the next one. (redis-py's
    default retries it with a backoff of seconds, and a dead Sentinel first in
    the list held every lookup of the master, so every command, that long.)"""
    return {"socket_timeout": SENTINEL_TIMEOUT, "retry": Retry(NoBackoff(), 0)}


@dataclass(frozen=True)
class SentinelTarget:
    """The Sentinels of a ``redis+sentinel://`` URL and the master they watch."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    def master_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of a connection to the master."""
        found: dict[str, Any] = {"db": self.db}
        if self.username:
            found["username"] = self.username
        if self.password:
            found["password"] = self.password
        return found


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """The Sentinels and master of a ``redis+sentinel://`` URL; None for any other URL.

    Raises:
        ValueError: the URL is malformed (no Sentinel, a bad port, no master
            name, a database that is not a number); the message names
            ``REDIS_URL`` and never the password.
    """
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    sentinels = tuple(_host_and_port(item) for item in hostlist.split(",") if item)
    if not sentinels:
        raise ValueError("REDIS_URL: a redis+sentinel:// URL names at least one Sentinel")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(
            "REDIS_URL: a redis+sentinel:// URL ends with /MASTER or /MASTER/DB, "
            f"not {parts.path!r}"
        )
    db = 0
    if len(path) == 2:
        if not (path[1].isascii() and path[1].isdigit()):
            raise ValueError(f"REDIS_URL: the database {path[1]!r} is not a number")
        db = int(path[1])
    return SentinelTarget(
        sentinels=sentinels,
        master=path[0],
        db=db,
        username=unquote(username) or None,
        password=unquote(password) or None,
    )


def _host_and_port(item: str) -> tuple[str, int]:
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    port = port or "26379"
    if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"REDIS_URL: {item!r} is not a Sentinel's HOST:PORT")
    return unquote(host), int(port)


class _BlockingSentinelPool(AsyncSentinelPool, aioredis.BlockingConnectionPool):
    """A Sentinel-managed pool that waits for a free connection (``timeout``
    seconds, as ``BlockingConnectionPool`` does) instead of raising "Too many
    connections": the connection class and master lookup are Sentinel's, the
    getting and releasing the blocking pool's."""


def async_client(url: str, *, max_connections: int, wait: float | None = None) -> aioredis.Redis:
    """An asyncio client for ``url``: a pool of ``max_connections``; with ``wait``,
    a call waits up to ``wait`` seconds for a free connection instead of failing."""
    target = parse_sentinel_url(url)
    if target is None:
        if wait is None:
            return aioredis.from_url(url, max_connections=max_connections)
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=wait
        )
        return aioredis.Redis(connection_pool=pool)
    sentinel = AsyncSentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs={**sentinel_kwargs(), "retry": AsyncRetry(NoBackoff(), 0)},
        socket_timeout=None,
    )
    extra: dict[str, Any] = {"max_connections": max_connections, **target.master_kwargs()}
    if wait is not None:
        extra.update(connection_pool_class=_BlockingSentinelPool, timeout=wait)
    client: aioredis.Redis = sentinel.master_for(target.master, **extra)
    return client


def sync_client(url: str, **kwargs: Any) -> redis.Redis:
    """A blocking client for ``url`` (``kwargs`` as ``redis.Redis.from_url``'s)."""
    target = parse_sentinel_url(url)
    if target is None:
        return redis.Redis.from_url(url, **kwargs)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=sentinel_kwargs(), **kwargs
    )
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.master, **target.master_kwargs()
    )
    return client


def layer_host(url: str) -> str | dict[str, Any]:
    """The ``hosts`` entry of ``channels_redis`` for ``url``."""
    target = parse_sentinel_url(url)
    if target is None:
        return url
    return {
        "sentinels": [list(address) for address in target.sentinels],
        "master_name": target.master,
        "sentinel_kwargs": {**sentinel_kwargs(), "retry": AsyncRetry(NoBackoff(), 0)},
        **target.master_kwargs(),
    }
