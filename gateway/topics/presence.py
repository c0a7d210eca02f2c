"""Presence of one process's topics: members, watchers, and the deployment-wide view.

docs/protocol.md, "Presence"; docs/design.md, "Presence is soft state". A
subscription to a topic whose ``presence`` setting is on *joins* the topic's
presence when it attaches and *leaves* when it ends. A subscription that asked
for ``presence=true`` also *watches* the topic: it is told of the other
members' joins and leaves.

- :class:`Presence` (one process, no ``REDIS_URL``): the members live here and
  a join or leave is told to the watchers at once.
- :class:`RedisPresence` (several processes): a join or leave is told to this
  process's watchers at once, as in one process. Each process also writes its
  members to Redis with an expiry it renews every :data:`REFRESH` seconds, so
  the members of a process that dies without a word expire
  :data:`MEMBER_TTL` seconds after its last renewal. Per topic,
  ``{prefix}:presence:{topic}`` is a sorted set (member id, scored by its
  expiry) and ``{prefix}:presence:{topic}:m`` a hash (member id -> the member's
  JSON and the process that holds it): they give the presence document and a
  watcher's first list of members. In the same pipeline as that write, each
  join and leave is published on the deployment's channel
  ``{prefix}:presence-events``; every process tells its watchers the other
  processes' joins and leaves from those events, so even a membership that
  ended at once is told as a join and a leave everywhere. What is queued is
  written in one pipeline per wake-up. Every :data:`POLL` seconds a process
  with watchers also reads a watched topic's members and tells what the
  events did not: the expiry of a dead process's members, and anything an
  event lost (Redis pub/sub does not keep what a dropped connection missed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import orjson
from redis.exceptions import RedisError

from gateway.core.errors import Unavailable
from gateway.core.presence import Member
from gateway.topics.redis_url import async_client

__all__ = [
    "BATCH",
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
#: Seconds between two reads of a watched topic's members: a dead process's
#: members are told as leaves within :data:`MEMBER_TTL` plus this (the joins
#: and leaves of live processes are told from events, at once).
POLL = 2.0
#: Most queued joins and leaves written in one pipeline.
BATCH = 512


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
        poll: seconds between reads of a watched topic (expiries, lost events).
        batch: most queued joins and leaves written in one pipeline.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "leasecast",
        member_ttl: float = MEMBER_TTL,
        refresh: float = REFRESH,
        poll: float = POLL,
        batch: int = BATCH,
    ) -> None:
        super().__init__()
        # One connection stays subscribed to the events; the writes, the polls
        # and every watcher's first read share the others.
        self.redis = async_client(url, max_connections=8, wait=10)
        self.prefix = prefix
        self.member_ttl = member_ttl
        self.refresh = refresh
        self.poll = poll
        self.batch = batch
        #: this process among the deployment's: it tells its own joins and
        #: leaves at once, so it skips its own events and Redis entries
        self.origin = uuid.uuid4().hex
        #: where every process publishes its joins and leaves
        self.channel = f"{prefix}:presence-events"
        # Writes in the order they were asked for: a join, then its leave.
        # None: renew every member of this process.
        self._writes: asyncio.Queue[tuple[str, Member, bool] | None] = asyncio.Queue()
        #: the other processes' members told to this process's watchers, per watched topic
        self._seen: dict[str, dict[str, Member]] = {}
        # Per topic, the member ids told while a read of the topic was under
        # way: that read may predate them, so it says nothing about them.
        self._touched: dict[str, list[set[str]]] = {}
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write_loop()),
            loop.create_task(self._refresh_loop()),
            loop.create_task(self._event_loop()),
            loop.create_task(self._poll_loop()),
        ]

    def _keys(self, topic: str) -> tuple[str, str]:
        base = f"{self.prefix}:presence:{topic}"
        return base, f"{base}:m"

    # This process's watchers are told at once (Presence); the other
    # processes' from the event written with the member set.
    def _joined(self, topic: str, member: Member) -> None:
        self._touch(topic, member.client)
        super()._joined(topic, member)
        self._writes.put_nowait((topic, member, True))

    def _left(self, topic: str, member: Member) -> None:
        self._touch(topic, member.client)
        super()._left(topic, member)
        self._writes.put_nowait((topic, member, False))

    def _touch(self, topic: str, client: str) -> None:
        for touched in self._touched.get(topic, ()):
            touched.add(client)

    @contextlib.contextmanager
    def _reading(self, topic: str) -> Iterator[set[str]]:
        """The member ids of ``topic`` told while the block runs."""
        touched: set[str] = set()
        self._touched.setdefault(topic, []).append(touched)
        try:
            yield touched
        finally:
            reading = self._touched[topic]
            for i, other in enumerate(reading):
                if other is touched:
                    del reading[i]
                    break
            if not reading:
                del self._touched[topic]

    async def members(self, topic: str) -> list[Member]:
        try:
            others = await self._read(topic)
        except (RedisError, OSError) as exc:
            raise Unavailable(f"presence could not be read from Redis: {exc}") from exc
        return list(self.local.get(topic, {}).values()) + list(others.values())

    async def watch(self, topic: str, watcher: PresenceWatcher) -> list[Member]:
        # Told from now on: what changes while Redis is read comes as joins and
        # leaves (a subscription holds them until its first presence frame),
        # so the list returned leaves those members out.
        first = topic not in self._seen
        self._watchers.setdefault(topic, {})[watcher.client] = watcher
        seen = self._seen.setdefault(topic, {})
        here = list(self.local.get(topic, {}).values())
        try:
            with self._reading(topic) as touched:
                others = await self._read(topic)
        except BaseException as exc:
            self.unwatch(topic, watcher.client)
            if isinstance(exc, (RedisError, OSError)):
                raise Unavailable(f"presence could not be read from Redis: {exc}") from exc
            raise
        found = [m for c, m in others.items() if c not in touched]
        if first:
            for m in found:
                seen.setdefault(m.client, m)
        return here + found

    def unwatch(self, topic: str, client: str) -> None:
        super().unwatch(topic, client)
        if topic not in self._watchers:
            self._seen.pop(topic, None)

    def _encode(self, member: Member, **more: str) -> bytes:
        """The member as the hash and the events hold it: with this process's id."""
        return orjson.dumps(
            {
                "client": member.client,
                "user": member.user,
                "info": member.info,
                "origin": self.origin,
                **more,
            }
        )

    async def _read(self, topic: str) -> dict[str, Member]:
        """The topic's live members of the other processes; expired ones are removed."""
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
            if orjson.loads(raw).get("origin") != self.origin:
                found[member.client] = member
        return found

    def _add_writes(self, pipe: Any, batch: list[tuple[str, Member, bool] | None]) -> None:
        """Queue ``batch``'s writes on ``pipe``: each change to the member set, then its event."""
        ttl = int(self.member_ttl * 4)
        for item in batch:
            if item is None:
                self._add_renewal(pipe)
                continue
            topic, member, joined = item
            zkey, hkey = self._keys(topic)
            if joined:
                pipe.hset(hkey, member.client, self._encode(member))
                pipe.zadd(zkey, {member.client: time.time() + self.member_ttl})
                pipe.expire(zkey, ttl)
                pipe.expire(hkey, ttl)
            else:
                pipe.zrem(zkey, member.client)
                pipe.hdel(hkey, member.client)
            kind = "join" if joined else "leave"
            pipe.publish(self.channel, self._encode(member, topic=topic, kind=kind))

    def _add_renewal(self, pipe: Any) -> None:
        # Built from the members now, in line with the joins and leaves: a
        # member that left is not written back.
        expiry = time.time() + self.member_ttl
        ttl = int(self.member_ttl * 4)
        for topic, members in self.local.items():
            if not members:
                continue
            zkey, hkey = self._keys(topic)
            pipe.hset(hkey, mapping={c: self._encode(m) for c, m in members.items()})
            pipe.zadd(zkey, dict.fromkeys(members, expiry))
            pipe.expire(zkey, ttl)
            pipe.expire(hkey, ttl)

    def _drain(self, batch: list[tuple[str, Member, bool] | None]) -> None:
        while len(batch) < self.batch and not self._writes.empty():
            batch.append(self._writes.get_nowait())

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._writes.get()]
            self._drain(batch)  # all that queued meanwhile: one round trip
            try:
                async with self.redis.pipeline(transaction=True) as pipe:
                    self._add_writes(pipe, batch)
                    await pipe.execute()
            except (RedisError, OSError) as exc:
                # Soft state: a join not written is written by the next
                # renewal; a leave not written expires. Other processes are
                # told of either by their poll.
                log.warning("%d presence changes not written to Redis: %s", len(batch), exc)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh)
            if self.local:
                self._writes.put_nowait(None)

    def _on_event(self, raw: bytes | str) -> None:
        """Another process's join or leave: told to this process's watchers of its topic."""
        try:
            member = Member.decode(raw)
            event = orjson.loads(raw)
        except ValueError:
            return
        topic, kind = event.get("topic"), event.get("kind")
        if event.get("origin") == self.origin or not isinstance(topic, str):
            return
        self._touch(topic, member.client)
        seen = self._seen.get(topic)
        if seen is None:
            return  # nobody here watches the topic
        if kind == "join":
            if member.client not in seen:  # else the poll told it first
                seen[member.client] = member
                self._tell(topic, [member], [])
        elif kind == "leave":
            known = seen.pop(member.client, None)
            if known is not None:  # else never told here, or the poll told it first
                self._tell(topic, [], [known])

    async def _event_loop(self) -> None:
        while True:
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.channel)
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        self._on_event(message["data"])
            except (RedisError, OSError) as exc:
                # What was published meanwhile is lost: the poll tells it.
                log.warning("presence events not read from Redis: %s", exc)
                await asyncio.sleep(1)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            for topic in list(self._watchers):
                try:
                    with self._reading(topic) as touched:
                        now = await self._read(topic)
                except (RedisError, OSError) as exc:
                    log.warning("presence of %r not read from Redis: %s", topic, exc)
                    break
                seen = self._seen.get(topic)
                if seen is None:
                    continue  # unwatched meanwhile
                # Only what no event told: a dead process's expired members,
                # and changes whose event was lost.
                joins = [m for c, m in now.items() if c not in seen and c not in touched]
                leaves = [m for c, m in seen.items() if c not in now and c not in touched]
                for m in joins:
                    seen[m.client] = m
                for m in leaves:
                    del seen[m.client]
                if joins or leaves:
                    self._tell(topic, joins, leaves)

    def close(self) -> None:
        """Stop writing, renewing and reading; this process's members expire."""
        for task in self._tasks:
            task.cancel()

    async def aclose(self) -> None:
        """:meth:`close`, and take this process's members out of Redis at once.

        What was still queued is written first; every member still here is
        then told as a leave to the other processes.
        """
        self.close()
        batch: list[tuple[str, Member, bool] | None] = []
        while not self._writes.empty():
            item = self._writes.get_nowait()
            if item is not None:
                batch.append(item)
        with contextlib.suppress(RedisError, OSError):
            async with self.redis.pipeline(transaction=False) as pipe:
                self._add_writes(pipe, batch)
                for topic, members in self.local.items():
                    zkey, hkey = self._keys(topic)
                    if members:
                        pipe.zrem(zkey, *members)
                        pipe.hdel(hkey, *members)
                    for member in members.values():
                        event = self._encode(member, topic=topic, kind="leave")
                        pipe.publish(self.channel, event)
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
