"""Presence of one process's topics: members, watchers, and the deployment-wide view.

docs/protocol.md, "Presence"; docs/design.md, "Presence is soft state". A
subscription to a topic whose ``presence`` setting is on *joins* the topic's
presence when it attaches and *leaves* when it ends. A subscription that asked
for ``presence=true`` also *watches* the topic: it is told of the other
members' joins and leaves.

- :class:`Presence` (one process, no ``REDIS_URL``): the members live here and
  a join or leave is told to the watchers at once.
- :class:`RedisPresence` (several processes): each process keeps its own
  members and writes them to Redis with an expiry it renews every
  :data:`REFRESH` seconds, so the members of a process that dies without a
  word expire :data:`MEMBER_TTL` seconds after its last renewal. Per topic,
  ``{prefix}:presence:{topic}`` is a sorted set (member id, scored by its
  expiry) and ``{prefix}:presence:{topic}:m`` a hash (member id -> the member's
  JSON). A process with watchers of a topic reads the topic's live members
  every :data:`POLL` seconds, and tells its watchers the difference from
  the previous read: joins and leaves from every process, its own included,
  and the expiry of a dead process's members, all the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.core.errors import Unavailable
from gateway.core.presence import Member
from gateway.topics.redis_url import async_client

__all__ = [
    "MEMBER_TTL",
    "POLL",
    "REFRESH",
    "Presence",
    "PresenceMeter",
    "PresenceWatcher",
    "RedisPresence",
    "shared_presence_counts",
]

log = logging.getLogger("leasecast.presence")

#: Seconds a member outlives its process's last renewal in Redis.
MEMBER_TTL = 15.0
#: Seconds between a process's renewals of its members.
REFRESH = 5.0
#: Seconds between two reads of a watched topic's members (joins and leaves
#: from other processes reach a watcher within about this).
POLL = 0.5


class PresenceWatcher(Protocol):
    """A subscription that asked to be told of the other members' joins and leaves."""

    @property
    def client(self) -> str:
        """Its own member id: it is not told of itself."""

    def presence_changed(self, joins: list[Member], leaves: list[Member]) -> None:
        """Members arrived (``joins``) or went (``leaves``); never empty both."""


class PresenceMeter(Protocol):
    """What presence counts (the runtime's metrics registry)."""

    def topic_presence(self, topic: str, members: int) -> None:
        """``topic`` has ``members`` subscriptions on this process."""


class Presence:
    """The presence of one process's topics, kept here (one process, no Redis).

    Subclassed by :class:`RedisPresence`, which shares it between processes.

    Args:
        meter: told each topic's count of members here (metrics), if given.
    """

    def __init__(self, meter: PresenceMeter | None = None) -> None:
        self.meter = meter
        #: this process's members, by topic, by member id
        self.local: dict[str, dict[str, Member]] = {}
        self._watchers: dict[str, dict[str, PresenceWatcher]] = {}

    # -- members

    def join(self, topic: str, member: Member) -> None:
        """A subscription of ``topic`` attached (the topic has presence)."""
        members = self.local.setdefault(topic, {})
        members[member.client] = member
        if self.meter is not None:
            self.meter.topic_presence(topic, len(members))
        self._joined(topic, member)

    def leave(self, topic: str, client: str) -> None:
        """The subscription ``client`` of ``topic`` ended; nothing if it never joined."""
        members = self.local.get(topic)
        if members is None:
            return
        member = members.pop(client, None)
        if self.meter is not None:
            self.meter.topic_presence(topic, len(members))
        if not members:
            del self.local[topic]
        if member is not None:
            self._left(topic, member)

    def _joined(self, topic: str, member: Member) -> None:
        self._tell(topic, [member], [])

    def _left(self, topic: str, member: Member) -> None:
        self._tell(topic, [], [member])

    async def members(self, topic: str) -> list[Member]:
        """Every member of ``topic`` on every process, in no particular order.

        Raises:
            Unavailable: the shared store could not be read (Redis).
        """
        return list(self.local.get(topic, {}).values())

    def counts(self) -> dict[str, int]:
        """This process's members per topic (the ``leasecast_topic_presence`` gauge)."""
        return {topic: len(members) for topic, members in self.local.items()}

    # -- watchers

    async def watch(self, topic: str, watcher: PresenceWatcher) -> list[Member]:
        """Tell ``watcher`` of the topic's joins and leaves from now on; returns its members now."""
        self._watchers.setdefault(topic, {})[watcher.client] = watcher
        return await self.members(topic)

    def unwatch(self, topic: str, client: str) -> None:
        """Stop telling the watcher ``client`` (its subscription ended)."""
        watchers = self._watchers.get(topic)
        if watchers is not None:
            watchers.pop(client, None)
            if not watchers:
                del self._watchers[topic]

    def _tell(self, topic: str, joins: list[Member], leaves: list[Member]) -> None:
        for watcher in list(self._watchers.get(topic, {}).values()):
            own = watcher.client
            j = [m for m in joins if m.client != own]
            left = [m for m in leaves if m.client != own]
            if j or left:
                watcher.presence_changed(j, left)

    def watched(self) -> Iterable[str]:
        """The topics some subscription of this process watches."""
        return list(self._watchers)

    def close(self) -> None:
        """Stop (nothing runs in one process)."""

    async def aclose(self) -> None:
        """Stop, and take this process's members out of the shared view."""
        self.close()


class RedisPresence(Presence):
    """The presence of every process's topics, shared through Redis.

    Args:
        url: the Redis every gateway process shares (``REDIS_URL``).
        prefix: prefix of Leasecast's Redis keys (``GATEWAY_REDIS_PREFIX``).
        member_ttl: seconds a member outlives its process's last renewal.
        refresh: seconds between renewals.
        poll: seconds between reads of a watched topic.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "leasecast",
        member_ttl: float = MEMBER_TTL,
        refresh: float = REFRESH,
        poll: float = POLL,
    ) -> None:
        super().__init__()
        self.redis = async_client(url, max_connections=4, wait=10)
        self.prefix = prefix
        self.member_ttl = member_ttl
        self.refresh = refresh
        self.poll = poll
        # Writes in the order they were asked for: a join, then its leave.
        self._writes: asyncio.Queue[tuple[str, str, Member | None]] = asyncio.Queue()
        #: the members last read of each watched topic
        self._seen: dict[str, dict[str, Member]] = {}
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write_loop()),
            loop.create_task(self._refresh_loop()),
            loop.create_task(self._poll_loop()),
        ]

    def _keys(self, topic: str) -> tuple[str, str]:
        base = f"{self.prefix}:presence:{topic}"
        return base, f"{base}:m"

    # Told through the poll, the same way as other processes' changes.
    def _joined(self, topic: str, member: Member) -> None:
        self._writes.put_nowait((topic, member.client, member))

    def _left(self, topic: str, member: Member) -> None:
        self._writes.put_nowait((topic, member.client, None))

    async def members(self, topic: str) -> list[Member]:
        try:
            return list((await self._read(topic)).values())
        except RedisError as exc:
            raise Unavailable(f"presence could not be read from Redis: {exc}") from exc

    async def watch(self, topic: str, watcher: PresenceWatcher) -> list[Member]:
        members = await self.members(topic)
        self._watchers.setdefault(topic, {})[watcher.client] = watcher
        self._seen.setdefault(topic, {m.client: m for m in members})
        return members

    def unwatch(self, topic: str, client: str) -> None:
        super().unwatch(topic, client)
        if topic not in self._watchers:
            self._seen.pop(topic, None)

    async def _read(self, topic: str) -> dict[str, Member]:
        """The topic's live members; expired ones are removed on the way."""
        zkey, hkey = self._keys(topic)
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrangebyscore(zkey, now, "+inf")
            pipe.zrangebyscore(zkey, "-inf", now)
            clients, expired = await pipe.execute()
        if expired:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(zkey, "-inf", now)
                pipe.hdel(hkey, *expired)
                await pipe.execute()
        if not clients:
            return {}
        found: dict[str, Member] = {}
        for raw in await self.redis.hmget(hkey, clients):
            if raw is None:
                continue
            try:
                member = Member.decode(raw)
            except ValueError:
                continue
            found[member.client] = member
        return found

    async def _write_loop(self) -> None:
        while True:
            topic, client, member = await self._writes.get()
            zkey, hkey = self._keys(topic)
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    if member is None:
                        pipe.zrem(zkey, client)
                        pipe.hdel(hkey, client)
                    else:
                        pipe.hset(hkey, client, member.encode())
                        pipe.zadd(zkey, {client: time.time() + self.member_ttl})
                        pipe.expire(zkey, int(self.member_ttl * 4))
                        pipe.expire(hkey, int(self.member_ttl * 4))
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                # Soft state: a join not written is written by the next
                # renewal; a leave not written expires.
                log.warning("presence of %r not written to Redis: %s", topic, exc)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            try:
                await self._renew()
            except (RedisError, OSError) as exc:
                log.warning("presence not renewed in Redis: %s", exc)

    async def _renew(self) -> None:
        if not self.local:
            return
        expiry = time.time() + self.member_ttl
        async with self.redis.pipeline(transaction=False) as pipe:
            for topic, members in list(self.local.items()):
                zkey, hkey = self._keys(topic)
                if not members:
                    continue
                pipe.hset(hkey, mapping={c: m.encode() for c, m in members.items()})
                pipe.zadd(zkey, dict.fromkeys(members, expiry))
                pipe.expire(zkey, int(self.member_ttl * 4))
                pipe.expire(hkey, int(self.member_ttl * 4))
            await pipe.execute()

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            for topic in list(self._watchers):
                try:
                    now = await self._read(topic)
                except (RedisError, OSError) as exc:
                    log.warning("presence of %r not read from Redis: %s", topic, exc)
                    break
                before = self._seen.get(topic)
                if before is None or topic not in self._watchers:
                    continue  # unwatched meanwhile
                joins = [m for c, m in now.items() if c not in before]
                leaves = [m for c, m in before.items() if c not in now]
                self._seen[topic] = now
                if joins or leaves:
                    self._tell(topic, joins, leaves)

    def close(self) -> None:
        """Stop renewing and reading; this process's members expire (or were left)."""
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """:meth:`close`, and take this process's members out of Redis at once."""
        self.close()
        with contextlib.suppress(RedisError, OSError):
            async with self.redis.pipeline(transaction=False) as pipe:
                for topic, members in self.local.items():
                    zkey, hkey = self._keys(topic)
                    if members:
                        pipe.zrem(zkey, *members)
                        pipe.hdel(hkey, *members)
                await pipe.execute()
        with contextlib.suppress(RedisError, OSError):
            await self.redis.aclose()


def shared_presence_counts(client: Any, prefix: str, now: float) -> dict[str, int]:
    """Live members per topic, as every process wrote them to Redis (blocking).

    Args:
        client: a synchronous ``redis.Redis``.
        prefix: the deployment's key prefix (``GATEWAY_REDIS_PREFIX``).
        now: the current Unix time: members that expired by then are not counted.
    """
    head = f"{prefix}:presence:"
    counts: dict[str, int] = {}
    for raw in client.scan_iter(match=f"{head}*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        topic = key[len(head) :]
        if topic.endswith(":m"):
            continue  # the members' hash, beside each topic's sorted set
        counts[topic] = int(client.zcount(key, now, "+inf"))
    return counts
