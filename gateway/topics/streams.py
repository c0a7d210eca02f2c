"""Topic offsets, history and relay for several gateway processes: Redis Streams.

design decision 11. With ``REDIS_URL`` set, each topic has, in Redis:

- ``{prefix}:topic:{name}:meta``, a hash: ``epoch`` and ``offset`` (the latest);
- ``{prefix}:topic:{name}:stream``, a stream whose entry ids are ``0-OFFSET``,
  fields ``b`` (the body) and ``t`` (publish time).

One Lua script appends a batch: it makes the epoch if the hash is missing
(first use, or Redis lost its data: a new epoch, never a silent gap) or was
made on another master (below), takes the offsets with HINCRBY and adds the
entries, trimmed to the larger of the
topic's ``history_size`` and ``GATEWAY_TOPIC_RELAY_WINDOW``. The stream is
at once the sequencer (offsets grow by one per publish across processes),
the history (range reads by offset) and the relay: every process reads the
streams of the topics it has subscribers for with one blocking XREAD and
dispatches what it reads, its own publishes included, in offset order.

A replaced master. Replication is asynchronous, so a replica promoted by
Sentinel (or by hand) may lack the last publishes the old master confirmed:
its offsets are behind the ones handed out, and carrying on in the same
epoch would give new messages offsets that subscribers already passed. So
the hash also holds ``m``, the replication id (``master_replid``) of the
master that made or adopted the epoch, which a promoted replica changes: the
scripts, which read it with ``INFO replication`` on the server they run on,
start a new epoch when it differs, and the reader asks for it with every
read and, when it changed, checks every followed topic before delivering
anything more (subscribers closed with 4409, docs/protocol.md). A hash
without ``m`` (written by an earlier version) adopts the current master.

Why not the Channels layer for topics, as v1 did: a ``group_send`` per
publish carries no deployment-wide order, so two processes publishing to one
topic would deliver in different orders, and resuming needs the history in
one place anyway. Measurements: docs/benchmarks.md, "Topic streams".

Publishes are batched: they join this process's outbox and one sender task
turns the publishes of a topic that piled up into one script call (so a
pipelining producer costs one round trip per batch, not one per frame, and
one connection, whatever the rate). Past ``MAX_OUTBOX`` waiting messages a
publish is refused with ``backpressure`` (protocol 1.1: a refusal for load is
never ``unavailable``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.core.errors import Backpressure, Unavailable
from gateway.core.history import Entry, Head, TopicSettings, new_epoch
from gateway.topics.presence import Presence, RedisPresence
from gateway.topics.redis_url import async_client
from gateway.topics.settings import TopicSettingsCache

__all__ = ["RedisTopics"]

log = logging.getLogger("leasecast.streams")

#: Most messages waiting in the outbox before a publish is refused with backpressure.
MAX_OUTBOX = 100_000
#: At most this many messages, and about this many body bytes, per script call.
BATCH_ITEMS = 1000
BATCH_BYTES = 1024 * 1024
#: Entries one XREAD takes per stream.
READ_COUNT = 1000
#: How long one blocking XREAD waits (ms) before looking at its topics again:
#: a topic followed meanwhile is read from its follow position within this.
READ_BLOCK_MS = 100
#: Longest wait (seconds) between the reader's attempts while Redis fails.
READ_RETRY_MAX = 1.0
#: Seconds between checks that the followed topics' epochs still stand (a
#: Redis that lost its data while nothing was published is seen this way).
EPOCH_CHECK = 1.0
#: Seconds a topic's keys live after its last publish, at least.
KEY_TTL = 24 * 3600

#: Lua: the topic's epoch in ``epoch``, a new one (offsets from 0, the stream
#: emptied) if the hash is missing or was made on another master.
_EPOCH = """
local meta, stream = KEYS[1], KEYS[2]
local source = string.match(redis.call('INFO', 'replication'), 'master_replid:(%%w+)')
local found = redis.call('HMGET', meta, 'epoch', 'm')
local epoch, made_on = found[1], found[2]
if epoch and made_on and made_on ~= source then
  epoch = false
end
if not epoch then
  epoch = ARGV[1]
  redis.call('DEL', stream)
  redis.call('HSET', meta, 'epoch', epoch, 'offset', 0, 'm', source)
elseif not made_on then
  redis.call('HSET', meta, 'm', source)
end
"""

_APPEND = (
    _EPOCH
    + """
local n = #ARGV - 4
local last = redis.call('HINCRBY', meta, 'offset', n)
local first = last - n + 1
for i = 1, n do
  if ARGV[3] == '1' then
    redis.call('XADD', stream, 'MAXLEN', '~', ARGV[2], '0-' .. (first + i - 1),
               'b', ARGV[4 + i], 't', ARGV[4])
  else
    redis.call('XADD', stream, 'MAXLEN', ARGV[2], '0-' .. (first + i - 1),
               'b', ARGV[4 + i], 't', ARGV[4])
  end
end
redis.call('EXPIRE', meta, %(ttl)d)
redis.call('EXPIRE', stream, %(ttl)d)
return {epoch, last}
"""
)

#: Lua: ``pack(rows)`` makes XRANGE's rows one string, per entry
#: ``OFFSET,TIME,LENGTH:BODY`` (:func:`unpack_entries`). One bulk reply
#: instead of seven nested replies per entry: redis-py parses each reply
#: element in Python (45-65 us an entry here, without hiredis), which was
#: most of a replay's time and capped what a stream reader could take
#: (docs/benchmarks.md, "Topic streams").
_PACK = """
local function pack(rows)
  local out, k = {}, 0
  for i = 1, #rows do
    local id, fields = rows[i][1], rows[i][2]
    local body, at = fields[2], fields[4]
    if fields[1] ~= 'b' then
      body, at = fields[4], fields[2]
    end
    out[k + 1] = string.sub(id, string.find(id, '-', 1, true) + 1)
    out[k + 2] = ','
    out[k + 3] = at
    out[k + 4] = ','
    out[k + 5] = #body
    out[k + 6] = ':'
    out[k + 7] = body
    k = k + 7
  end
  return table.concat(out)
end
"""

#: Lua: up to ARGV[2] entries of the stream KEYS[1] from id ARGV[1] on, packed.
_RANGE = _PACK + "return pack(redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2]))"

#: Lua: the replication id, then, for each stream of KEYS, up to ARGV[1] of its
#: entries from id ARGV[i + 1] on, packed: what a non-blocking XREAD of them
#: gives, from the same server as the id.
_READ = (
    _PACK
    + """
local out = {string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or false}
for i = 1, #KEYS do
  out[i + 1] = pack(redis.call('XRANGE', KEYS[i], ARGV[i + 1], '+', 'COUNT', ARGV[1]))
end
return out
"""
)

#: Lua: the replication id, exactly as the scripts read it.
_SOURCE = "return string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)')"

_HEAD = (
    _EPOCH
    + """
if redis.call('TTL', meta) < 0 then
  redis.call('EXPIRE', meta, %(ttl)d)
end
return {epoch, redis.call('HGET', meta, 'offset')}
"""
)

#: A publish waiting in the outbox: topic, bodies, and its waiter.
Outgoing = tuple[str, list[bytes], asyncio.Future[Head]]


class RedisTopics:
    """The processes' shared topic streams (``gateway.topics.broadcast.SharedTopics``).

    Args:
        url: the Redis URL.
        settings: the topics' settings (history size: how much a stream keeps).
        prefix: prefix of every key.
        window: entries a stream keeps at least, for readers catching up.
    """

    def __init__(
        self,
        url: str,
        *,
        settings: TopicSettingsCache,
        prefix: str = "leasecast",
        window: int = 10_000,
    ) -> None:
        # A pool that waits for a free connection (up to 10 s) rather than
        # raising "Too many connections": a hundred sockets subscribing at
        # once each read their topic's head (found by bench/topics.py).
        # With a redis+sentinel:// URL both follow the master the Sentinels name
        # (gateway.topics.redis_url).
        self.redis = async_client(url, max_connections=32, wait=10)
        # Its own connection: a blocking XREAD holds one while it waits.
        self._reader_redis = async_client(url, max_connections=2)
        #: who subscribes to topics with presence, on every process
        self.presence: Presence = RedisPresence(url, prefix=prefix)
        self.settings = settings
        self.prefix = prefix
        self.window = window
        ttl = {"ttl": KEY_TTL}
        self._append = self.redis.register_script(_APPEND % ttl)
        self._head = self.redis.register_script(_HEAD % ttl)
        self._range = self.redis.register_script(_RANGE)
        self._source_of = self.redis.register_script(_SOURCE)
        self._reader_source_of = self._reader_redis.register_script(_SOURCE)
        self._reader_read = self._reader_redis.register_script(_READ)
        self._outbox: deque[Outgoing] = deque()
        self._waiting = 0  # messages in the outbox
        self._outbox_ready = asyncio.Event()
        # topic -> last offset read; the reader's position per followed topic
        self._positions: dict[str, int] = {}
        self._changed = asyncio.Event()  # the followed set changed: restart the XREAD
        #: the replication id of the master the reader last read from
        self._source: str | None = None
        self._deliver: Callable[[str, list[Entry], int], Awaitable[None]] | None = None
        self._restart: Callable[[str], None] | None = None
        self._epoch_of: Callable[[str], str | None] = lambda topic: None
        self._tasks: list[asyncio.Task[None]] = []
        # Figures for the stats.
        self.appended = 0
        self.read_count = 0

    def start(
        self,
        deliver: Callable[[str, list[Entry], int], Awaitable[None]],
        restart: Callable[[str], None],
        epoch_of: Callable[[str], str | None],
    ) -> None:
        """Start the sender and the reader.

        Args:
            deliver: takes what is read, per topic, in offset order, and the
                offset up to which entries were found trimmed away (0: none).
            restart: told of a followed topic whose epoch changed (or vanished).
            epoch_of: the epoch a followed topic is dispatched in.
        """
        self._deliver, self._restart, self._epoch_of = deliver, restart, epoch_of
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._send_loop()), loop.create_task(self._read_loop())]

    async def close(self) -> None:
        """Stop the tasks and close the connections."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.presence.aclose()
        await self.redis.aclose()
        await self._reader_redis.aclose()

    def _keys(self, topic: str) -> list[str]:
        base = f"{self.prefix}:topic:{topic}"
        return [f"{base}:meta", f"{base}:stream"]

    # -- the sequence and the history

    async def head(self, topic: str) -> Head:
        """The topic's epoch and latest offset; the epoch is made on first use."""
        keys = self._keys(topic)
        try:
            epoch, offset = await _once_more(lambda: self._head(keys=keys, args=[new_epoch()]))
        except RedisError as exc:
            raise Unavailable(f"topic stream unavailable: {exc}") from exc
        return Head(_text(epoch), int(offset))

    async def read(self, topic: str, after: int, limit: int) -> list[Entry]:
        """Stored entries with offsets greater than ``after``, oldest first."""
        keys = [self._keys(topic)[1]]
        args: list[str | int] = [f"0-{after + 1}", limit]
        try:
            packed: Any = await _once_more(lambda: self._range(keys=keys, args=args))
        except RedisError as exc:
            raise Unavailable(f"topic history unavailable: {exc}") from exc
        return unpack_entries(packed)

    async def append(self, topic: str, bodies: list[bytes]) -> Head:
        """Append ``bodies`` in order; returns the epoch and the last one's offset.

        Raises:
            Backpressure: the outbox is full (the deployment is not keeping up).
            Unavailable: Redis failed; nothing is known to be appended.
        """
        if self._waiting + len(bodies) > MAX_OUTBOX:
            raise Backpressure(
                f"{self._waiting} messages are waiting for the topic streams; retry shortly",
                retry_after=0.1,
            )
        done: asyncio.Future[Head] = asyncio.get_running_loop().create_future()
        self._outbox.append((topic, bodies, done))
        self._waiting += len(bodies)
        self._outbox_ready.set()
        return await done

    async def _send_loop(self) -> None:
        while True:
            _raise_if_cancelled()
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            while self._outbox:
                pending, self._outbox = self._outbox, deque()
                for batch in _batches(pending):
                    await self._send_batch(batch)
                    self._waiting -= sum(len(bodies) for _, bodies, _ in batch)

    async def _send_batch(self, batch: list[Outgoing]) -> None:
        """One script call for consecutive publishes of one topic."""
        topic = batch[0][0]
        bodies = [body for _, some, _ in batch for body in some]
        try:
            settings = await self.settings.get(topic)
            epoch, last = await self._append(
                keys=self._keys(topic), args=self._append_args(settings, bodies)
            )
        except Exception as exc:  # Redis down, or the settings' database
            error = Unavailable(f"publish failed: {exc}")
            for *_, done in batch:
                if not done.done():
                    done.set_exception(error)
            return
        self.appended += len(bodies)
        offset = int(last) - len(bodies)
        for _, some, done in batch:
            offset += len(some)
            if not done.done():
                done.set_result(Head(_text(epoch), offset))

    def _append_args(self, settings: TopicSettings, bodies: list[bytes]) -> list[Any]:
        keep = max(settings.history_size, self.window)
        # Approximate trimming is cheaper but keeps up to a node more (about
        # 100 entries): fine for a large window, wrong for a small one.
        approx = "1" if keep >= 1000 else "0"
        return [new_epoch(), keep, approx, repr(time.time()), *bodies]

    # -- the relay: reading the followed topics

    def follow(self, topic: str, after: int) -> None:
        """Read the topic's entries after offset ``after`` from now on."""
        self._positions[topic] = after
        self._changed.set()

    def unfollow(self, topic: str) -> None:
        """Stop reading the topic."""
        if self._positions.pop(topic, None) is not None:
            self._changed.set()

    async def _read_loop(self) -> None:
        backoff = 0.1
        next_check = time.monotonic() + EPOCH_CHECK
        suspect = False  # a read failed: Redis may have restarted empty
        while True:
            _raise_if_cancelled()
            if not self._positions:
                self._changed.clear()
                await self._changed.wait()
                continue
            self._changed.clear()
            try:
                if suspect:
                    # Before reading again: a Redis that lost its data has new
                    # streams whose offsets must not pass for the old ones'.
                    await self._check_epochs()
                    suspect, backoff = False, 0.1
                    continue  # the followed set may have changed
                source, result = await self._read_streams(dict(self._positions))
                if source != self._source:
                    known, self._source = self._source, source
                    if known is not None:
                        # Another master: it may hold less than was delivered
                        # from the old one. Nothing it gave is delivered before
                        # every followed topic's epoch is checked against it.
                        log.warning("Redis master replaced (%s -> %s)", known, source)
                        suspect = True
                        continue
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + EPOCH_CHECK
                    await self._check_epochs()
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("reading topic streams failed (%s); retrying", exc)
                suspect = True
                await asyncio.sleep(backoff)
                # At most a second: one reader per process, and the relay
                # resumes within a second of Redis (or a new master) answering.
                backoff = min(backoff * 2, READ_RETRY_MAX)
                continue
            for topic, entries in result:
                if topic not in self._positions or not entries:
                    continue
                after = self._positions[topic]
                self._positions[topic] = entries[-1].offset
                self.read_count += len(entries)
                assert self._deliver is not None
                # Offsets between where this read started and its first entry
                # were trimmed before they were read (this process fell
                # further behind than the stream keeps).
                await self._deliver(
                    topic, entries, entries[0].offset - 1 if entries[0].offset > after + 1 else 0
                )

    async def _read_streams(
        self, positions: dict[str, int]
    ) -> tuple[str | None, list[tuple[str, list[Entry]]]]:
        """The master's replication id and the entries of the followed streams
        after ``positions`` (topic -> offset), both from the same server.

        What is there already comes packed, from one script call
        (``_READ``); only when there is nothing new does one blocking XREAD
        wait (up to ``READ_BLOCK_MS``) for the next entries, which then come
        as redis-py parses them (few: the ones that arrived meanwhile).
        """
        topics = list(positions)
        keys = [self._keys(topic)[1] for topic in topics]
        args: list[str | int] = [READ_COUNT, *(f"0-{positions[t] + 1}" for t in topics)]
        source, *packed = await self._reader_read(keys=keys, args=args)
        found = [(t, unpack_entries(p)) for t, p in zip(topics, packed, strict=True) if p]
        if found:
            return _optional_text(source), found
        streams: Any = {key: f"0-{positions[t]}" for t, key in zip(topics, keys, strict=True)}
        async with self._reader_redis.pipeline(transaction=False) as pipe:
            await self._reader_source_of(client=pipe)
            pipe.xread(streams, count=READ_COUNT, block=READ_BLOCK_MS)
            source, result = await pipe.execute()
        read = [
            (_topic_of(_text(key), self.prefix), [_entry(i, fields) for i, fields in rows])
            for key, rows in result or ()
        ]
        return _optional_text(source), read

    async def _check_epochs(self) -> None:
        """Tell the broadcaster of followed topics whose epoch changed, vanished, or
        was made on a master that has been replaced since."""
        if self._restart is None:
            return
        topics = list(self._positions)
        if not topics:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            await self._source_of(client=pipe)
            for topic in topics:
                pipe.hmget(self._keys(topic)[0], ["epoch", "m"])
            replid, *found = await pipe.execute()
        source = _optional_text(replid)
        for topic, (epoch, made_on) in zip(topics, found, strict=True):
            if topic in self._positions:
                replaced = made_on is not None and source is not None and _text(made_on) != source
                self._restart_if_changed(topic, None if epoch is None or replaced else _text(epoch))

    def _restart_if_changed(self, topic: str, epoch: str | None) -> None:
        assert self._restart is not None
        known = self._epoch_of(topic)
        if known is not None and epoch != known:
            self._restart(topic)


def _raise_if_cancelled() -> None:
    """Raise CancelledError in a task asked to stop whose cancellation was lost.

    redis-py sends with ``asyncio.wait_for`` (socket timeouts), which on
    Python 3.11 swallows a cancellation that arrives as the send completes;
    a loop that only stops when cancelled would then run on, and ``close()``
    wait for it for ever (seen in tests/integration/test_topic_stream_reads.py).
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def _once_more(call: Callable[[], Awaitable[Any]]) -> Any:
    """``call()``, and once more if the connection it got had died (a Redis that
    restarted: each pooled connection fails once). Only for calls that are safe
    to repeat: an append is not (it could add its messages twice)."""
    try:
        return await call()
    except (RedisConnectionError, RedisTimeoutError):
        return await call()


def _batches(pending: deque[Outgoing]) -> list[list[Outgoing]]:
    """``pending`` as batches of one topic each, every topic's in publish order."""
    batches: list[list[Outgoing]] = []
    open_batch: dict[str, tuple[list[Outgoing], int, int]] = {}  # topic -> (batch, items, bytes)
    for item in pending:
        topic, bodies = item[0], item[1]
        size = sum(len(b) for b in bodies)
        batch, items, total = open_batch.get(topic, (None, 0, 0))
        if batch is None or items + len(bodies) > BATCH_ITEMS or total + size > BATCH_BYTES:
            batch, items, total = [], 0, 0
            batches.append(batch)
        batch.append(item)
        open_batch[topic] = (batch, items + len(bodies), total + size)
    return batches


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(entry_id: Any, fields: dict[Any, Any]) -> Entry:
    offset = int(_text(entry_id).partition("-")[2])
    return Entry(offset, fields[b"b"], float(fields[b"t"]))


def unpack_entries(packed: bytes | str) -> list[Entry]:
    """The entries of a ``_RANGE`` reply (``OFFSET,TIME,LENGTH:BODY`` each), in order.

    Raises:
        ValueError: ``packed`` is not such a reply.
    """
    data = packed.encode() if isinstance(packed, str) else packed
    entries: list[Entry] = []
    append, find, pos, end = entries.append, data.find, 0, len(data)
    while pos < end:
        colon = find(b":", pos)
        if colon < 0:
            raise ValueError(f"not a packed stream range at byte {pos}")
        offset, at, length = data[pos:colon].split(b",")
        pos = colon + 1 + int(length)
        if pos > end:
            raise ValueError(f"a packed stream range cut short at byte {colon}")
        append(Entry(int(offset), data[colon + 1 : pos], float(at)))
    return entries


def _topic_of(key: str, prefix: str) -> str:
    return key[len(prefix) + len(":topic:") : -len(":stream")]
