"""Prometheus metrics of the whole deployment (protocol 1.1: Metrics, ``GET /metrics``).

One scrape of any gateway process describes every process, counting each
event once. The figures come from two places:

=====================  ========================================================
queues                 the database. The store adds to ``leasecast_queue_counter``
                       in the same transaction that moves the messages
                       (``Txn.count`` / ``Txn.write_counts``), so every path
                       that enqueues, leases, acks or dead-letters counts, on
                       any process or connection, and the totals survive
                       restarts; so is the lease-length histogram (each ack
                       adds to its bucket's counter). The per-state gauge
                       and the oldest visible message's age are read at
                       scrape time.
topics and sockets     each process's memory (:class:`Registry`). With Redis
                       (``REDIS_URL``), every process adds its new counts to
                       one Redis hash each second (``HINCRBY``) and writes its
                       socket gauges under a key of its own that expires, so a
                       dead process's sockets vanish and its counts stay; a
                       scrape reads Redis. Without Redis there is one
                       process, and a scrape reads its memory.
=====================  ========================================================

The runtime owns the process's :class:`ProcessMetrics` and hands its
registry to what counts: the broadcaster (``topic_published``,
``topic_delivered``, ``topic_dropped``, ``slow_consumer_closed``), the sockets
(``socket_opened``, ``socket_closed``) and the committer, which passes on what
the store's commits added to queue counters (``queue_counted``: the
dashboard's per-process rates). Each is a dictionary update under a lock:
cheap enough for the hot path.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from gateway.core.leases import LEASE_SECONDS_BUCKETS, format_bound
from gateway.engine import PROCESS_NAME
from gateway.engine.schedules import schedule_fired_family
from gateway.store.leasing import LEASE_SECONDS, LEASE_SECONDS_SUM
from gateway.topics.presence import shared_presence_counts

__all__ = [
    "CONTENT_TYPE",
    "QUEUE_COUNTERS",
    "TOPIC_COUNTERS",
    "Deployment",
    "ProcessMetrics",
    "RedisShare",
    "Registry",
    "read_queue_figures",
    "render",
    "scrape",
]

log = logging.getLogger("leasecast.metrics")

#: The exposition format ``GET /metrics`` answers in.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The counters the store keeps per queue (``leasecast_queue_<name>_total``).
QUEUE_COUNTERS = ("enqueued", "delivered", "redelivered", "acked", "dead_lettered")
#: The in-memory counters and their label names (``leasecast_<name>_total``).
TOPIC_COUNTERS: dict[str, tuple[str, ...]] = {
    "topic_published": ("topic",),
    "topic_delivered": ("topic",),
    "topic_dropped": ("topic", "policy"),
    "slow_consumers_closed": ("topic",),
}
_HELP = {
    "topic_published": "Messages published to the topic.",
    "topic_delivered": "Messages delivered to the topic's subscribers (one per subscriber).",
    "topic_dropped": "Messages dropped for the topic's subscribers, by buffer policy.",
    "slow_consumers_closed": "Subscriber sockets closed as slow consumers (policy block).",
    "enqueued": "Messages enqueued (every path; an operator's requeue or redrive counts).",
    "delivered": "Messages leased to workers (deliveries, redeliveries included).",
    "redelivered": "Deliveries of messages delivered before.",
    "acked": "Messages acked.",
    "dead_lettered": "Messages dead-lettered, by reason.",
}
#: Message states of ``leasecast_queue_messages``.
STATES = ("visible", "delayed", "in_flight", "dead")

#: This process's name in ``leasecast_sockets`` (the one ``/api/stats`` uses).
PROCESS = PROCESS_NAME
#: Seconds between two flushes of a process's counts to Redis.
FLUSH_INTERVAL = 1.0
#: Seconds a process's socket gauges outlive its last flush in Redis.
SOCKETS_TTL = 10.0

Key = tuple[str, tuple[str, ...]]

#: Most distinct topics a process keeps counters for (each costs about 1.5
#: KiB). Topic names are chosen by publishers, and a counter per name ever
#: used would grow without bound (and make every scrape as big); past this, a
#: new topic's counts go to the topic label :data:`OTHER_TOPICS`, which no real
#: topic can be named.
MAX_TOPICS = 1_000
OTHER_TOPICS = "(other)"


class Registry:
    """One process's in-memory counters and socket gauges. Thread-safe.

    Counts since the last :meth:`take_pending` are kept apart, for the
    process that shares them through Redis.
    """

    def __init__(self, process: str = PROCESS, *, max_topics: int = MAX_TOPICS) -> None:
        self.process = process
        self.max_topics = max_topics
        self._topics: set[str] = set()
        self._lock = threading.Lock()
        self._totals: dict[Key, int] = {}
        self._pending: dict[Key, int] = {}
        self._sockets: dict[str, int] = {}
        self._queues: dict[str, dict[str, int]] = {}
        self._presence: dict[str, int] = {}  # topic -> members here (one process)

    def count(self, name: str, labels: tuple[str, ...], n: int = 1) -> None:
        """Add ``n`` (>= 0) to counter ``name`` (a key of :data:`TOPIC_COUNTERS`)."""
        if n <= 0:
            return
        with self._lock:
            topic = labels[0] if labels else None
            if topic is not None and topic not in self._topics:
                if len(self._topics) < self.max_topics:
                    self._topics.add(topic)
                else:
                    labels = (OTHER_TOPICS, *labels[1:])
            key = (name, labels)
            self._totals[key] = self._totals.get(key, 0) + n
            self._pending[key] = self._pending.get(key, 0) + n

    def totals(self) -> dict[Key, int]:
        """Every counter of this process since it started."""
        with self._lock:
            return dict(self._totals)

    def take_pending(self) -> dict[Key, int]:
        """The counts since the last call, forgotten here (the caller shares them)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending

    def restore_pending(self, pending: Mapping[Key, int]) -> None:
        """Give back counts :meth:`take_pending` returned that could not be shared."""
        with self._lock:
            for key, n in pending.items():
                self._pending[key] = self._pending.get(key, 0) + n

    def topic_published(self, topic: str, n: int = 1) -> None:
        """``n`` messages were published to ``topic`` (once per publish, on the
        process that accepted it)."""
        self.count("topic_published", (topic,), n)

    def topic_delivered(self, topic: str, n: int = 1) -> None:
        """``n`` messages of ``topic`` were sent to one subscriber socket of this process."""
        self.count("topic_delivered", (topic,), n)

    def topic_dropped(self, topic: str, policy: str, n: int = 1) -> None:
        """``n`` messages of ``topic`` were dropped for a subscriber with buffer ``policy``."""
        self.count("topic_dropped", (topic, policy), n)

    def slow_consumer_closed(self, topic: str) -> None:
        """A subscriber of ``topic`` was closed as a slow consumer (4008)."""
        self.count("slow_consumers_closed", (topic,), 1)

    def socket_opened(self, kind: str) -> None:
        """A socket of ``kind`` (worker, producer, subscriber, dashboard) opened."""
        with self._lock:
            self._sockets[kind] = self._sockets.get(kind, 0) + 1

    def socket_closed(self, kind: str) -> None:
        """A socket of ``kind`` closed (its kind stays, at 0)."""
        with self._lock:
            self._sockets[kind] = max(0, self._sockets.get(kind, 0) - 1)

    def sockets(self) -> dict[str, int]:
        """Open sockets of this process by kind."""
        with self._lock:
            return dict(self._sockets)

    def topic_presence(self, topic: str, members: int) -> None:
        """``topic`` (with presence) has ``members`` subscriptions on this process."""
        with self._lock:
            self._presence[topic] = members

    def presence(self) -> dict[str, int]:
        """Members per topic with presence on this process (``leasecast_topic_presence``)."""
        with self._lock:
            return dict(self._presence)

    def queue_counted(self, counted: Mapping[tuple[str, str, str], int]) -> None:
        """Counts a committed store transaction of this process added to queues'
        counters, by (queue, counter, label): the dashboard's per-process rates."""
        with self._lock:
            for (queue, name, _), n in counted.items():
                if name not in QUEUE_COUNTERS:
                    continue  # the lease-length histogram's rows: scrapes only
                counters = self._queues.get(queue)
                if counters is None:
                    counters = self._queues[queue] = dict.fromkeys(QUEUE_COUNTERS, 0)
                counters[name] = counters.get(name, 0) + n

    def queue_counters(self) -> dict[str, dict[str, int]]:
        """Per queue, what this process's commits counted since it started."""
        with self._lock:
            return {queue: dict(counters) for queue, counters in self._queues.items()}


def _field(key: Key) -> str:
    return json.dumps([key[0], *key[1]], separators=(",", ":"))


def _unfield(raw: str | bytes) -> Key | None:
    try:
        name, *labels = json.loads(raw)
    except (ValueError, TypeError):
        return None
    if name not in TOPIC_COUNTERS or len(labels) != len(TOPIC_COUNTERS[name]):
        return None
    return name, tuple(str(label) for label in labels)


class RedisShare:
    """The deployment's in-memory figures in Redis, shared by every process.

    Args:
        client: a ``redis.Redis`` (synchronous) client.
        prefix: the deployment's key prefix (``GATEWAY_REDIS_PREFIX``); keys
            are ``PREFIX:metrics:counters`` and ``PREFIX:metrics:sockets:PROCESS``.
    """

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.counters_key = f"{prefix}:metrics:counters"
        self.sockets_prefix = f"{prefix}:metrics:sockets:"
        # One flush at a time: the scrape flushes too, and two flushes of one
        # process must not interleave the socket key's delete and write.
        self._flushing = threading.Lock()

    def flush(self, registry: Registry) -> None:
        """Add the registry's new counts to Redis and refresh its socket gauges.

        In one MULTI/EXEC: either all of it lands or none (the counts are
        then given back, for the next flush).
        """
        with self._flushing:
            pending = registry.take_pending()
            sockets = registry.sockets()
            key = self.sockets_prefix + registry.process
            try:
                pipe = self.client.pipeline(transaction=True)
                for counter, n in pending.items():
                    pipe.hincrby(self.counters_key, _field(counter), n)
                pipe.delete(key)
                if sockets:
                    pipe.hset(key, mapping=sockets)
                    pipe.expire(key, int(SOCKETS_TTL))
                pipe.execute()
            except Exception:
                registry.restore_pending(pending)
                raise

    def read(self) -> tuple[dict[Key, int], dict[str, dict[str, int]]]:
        """The deployment's counters, and each live process's sockets by kind."""
        counters: dict[Key, int] = {}
        for raw, value in self.client.hgetall(self.counters_key).items():
            key = _unfield(raw)
            if key is not None:
                counters[key] = int(value)
        sockets: dict[str, dict[str, int]] = {}
        for raw_key in self.client.scan_iter(match=self.sockets_prefix + "*", count=500):
            name = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            kinds = self.client.hgetall(raw_key)
            process = name[len(self.sockets_prefix) :]
            sockets[process] = {_text(kind): int(n) for kind, n in kinds.items()}
        return counters, sockets


def _text(raw: str | bytes) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class _Sharer(threading.Thread):
    """Flushes a registry to Redis every :data:`FLUSH_INTERVAL` seconds, for the
    life of the process (a daemon: the last second's counts die with it)."""

    def __init__(self, registry: Registry, share: RedisShare) -> None:
        super().__init__(name="leasecast-metrics", daemon=True)
        self.registry = registry
        self.share = share
        self.stopping = threading.Event()
        self._failing = False

    def run(self) -> None:
        while not self.stopping.wait(FLUSH_INTERVAL):
            try:
                self.share.flush(self.registry)
                self._failing = False
            except Exception as exc:
                if not self._failing:  # once per outage, not once a second
                    log.warning("metrics: Redis flush failed (%s: %s)", type(exc).__name__, exc)
                self._failing = True


class ProcessMetrics:
    """One process's figures: its registry and, with Redis, how it shares them.

    The runtime builds one (:attr:`gateway.runtime.Runtime.metrics`), starts
    it with the process and closes it with the process; nothing here starts
    a thread on import or on first use.

    Args:
        registry: the process's counters and socket gauges.
        share: where the processes of a deployment add theirs up (None: this
            process alone, no Redis).
    """

    def __init__(self, registry: Registry, share: RedisShare | None = None) -> None:
        self.registry = registry
        self.share = share
        self._sharer: _Sharer | None = None

    @classmethod
    def for_settings(cls, redis_url: str, prefix: str) -> ProcessMetrics:
        """A process's figures, shared through ``redis_url`` when there is one:
        metrics are shared exactly when topics are (``GATEWAY_REDIS_PREFIX``)."""
        if not redis_url:
            return cls(Registry())
        from gateway.topics.redis_url import sync_client

        # redis+sentinel:// included: it follows the master.
        client = sync_client(redis_url, socket_connect_timeout=3, socket_timeout=3)
        return cls(Registry(), RedisShare(client, prefix or "leasecast"))

    def start(self) -> None:
        """Share the registry every :data:`FLUSH_INTERVAL` seconds (one thread; with Redis)."""
        if self.share is not None and self._sharer is None:
            self._sharer = _Sharer(self.registry, self.share)
            self._sharer.start()

    def close(self) -> None:
        """Stop sharing (the counts of the last second stay in the registry)."""
        if self._sharer is not None:
            self._sharer.stopping.set()
            self._sharer = None


# -- the scrape ---------------------------------------------------------------------


@dataclass
class Deployment:
    """Everything one scrape shows."""

    #: (queue, counter, label) -> total over shards
    queue_counters: dict[tuple[str, str, str], int] = field(default_factory=dict)
    #: (queue, state) -> messages now
    queue_messages: dict[tuple[str, str], int] = field(default_factory=dict)
    #: queue -> age in seconds of its oldest visible message (0: none)
    queue_oldest: dict[str, float] = field(default_factory=dict)
    #: in-memory counters of every process
    counters: dict[Key, int] = field(default_factory=dict)
    #: process -> kind -> open sockets
    sockets: dict[str, dict[str, int]] = field(default_factory=dict)
    #: further metric families, rendered after the others: each part of the
    #: gateway with figures of its own (schedules' ``leasecast_schedule_fired_total``,
    #: presence's ``leasecast_topic_presence``) appends its families in :func:`scrape`
    more: list[Metric] = field(default_factory=list)


#: Which stored rows are in each protocol state at time %s (as gateway.store.operator).
_GAUGE_SQL = (
    "SELECT q.name, CASE"
    " WHEN m.state = 2 OR (m.expires_at IS NOT NULL AND m.expires_at <= %s) THEN 'dead'"
    " WHEN m.state = 0 OR m.visible_at <= %s THEN 'visible'"
    " WHEN m.state = 1 THEN 'in_flight'"
    " ELSE 'delayed' END AS st, COUNT(*), MIN(m.enqueued_at)"
    " FROM leasecast_message AS m JOIN leasecast_queue AS q ON q.id = m.queue_id"
    " GROUP BY q.name, st"
)
_COUNTERS_SQL = (
    "SELECT q.name, c.name, c.label, SUM(c.value)"
    " FROM leasecast_queue_counter AS c JOIN leasecast_queue AS q ON q.id = c.queue_id"
    " GROUP BY q.name, c.name, c.label"
)


def read_queue_figures(cursor: Any, now: float, placeholder: str = "%s") -> Deployment:
    """Queue counters and per-state counts from the database (read only).

    Messages past their ttl that no sweep has dead-lettered yet are counted
    dead, as ``GET /api/queues/QUEUE`` does; every queue ever used appears,
    with 0 for its empty states.
    """
    figures = Deployment()
    cursor.execute("SELECT name FROM leasecast_queue")
    for (name,) in cursor.fetchall():
        for state in STATES:
            figures.queue_messages[(name, state)] = 0
        figures.queue_oldest[name] = 0.0
    cursor.execute(_GAUGE_SQL.replace("%s", placeholder), (now, now))
    for name, state, n, first in cursor.fetchall():
        figures.queue_messages[(name, state)] = int(n)
        if state == "visible" and first is not None:
            # Since its enqueue, as GET /api/queues/QUEUE's oldest_visible_age.
            figures.queue_oldest[name] = max(0.0, now - float(first))
    cursor.execute(_COUNTERS_SQL)
    for queue, name, label, value in cursor.fetchall():
        figures.queue_counters[(queue, name, label or "")] = int(value)
    return figures


class _Families(Collector):
    """Turns one :class:`Deployment` into metric families."""

    def __init__(self, figures: Deployment) -> None:
        self.figures = figures

    def collect(self) -> Iterable[Metric]:
        return list(_families(self.figures))


def _families(figures: Deployment) -> Iterator[Metric]:
    gauge = GaugeMetricFamily(
        "leasecast_queue_messages", "Messages in the queue by state.", labels=["queue", "state"]
    )
    for (queue, state), n in sorted(figures.queue_messages.items()):
        gauge.add_metric([queue, state], n)
    yield gauge
    for name in QUEUE_COUNTERS:
        names = ["queue", "reason"] if name == "dead_lettered" else ["queue"]
        family = CounterMetricFamily(f"leasecast_queue_{name}", _HELP[name], labels=names)
        for (queue, counter, label), n in sorted(figures.queue_counters.items()):
            if counter == name:
                family.add_metric([queue, label] if name == "dead_lettered" else [queue], n)
        yield family
    oldest = GaugeMetricFamily(
        "leasecast_queue_oldest_age_seconds",
        "Age (since enqueue) of the queue's oldest visible message; 0 when none.",
        labels=["queue"],
    )
    for queue, age in sorted(figures.queue_oldest.items()):
        oldest.add_metric([queue], age)
    yield oldest
    yield _lease_seconds(figures)
    for name, label_names in TOPIC_COUNTERS.items():
        family = CounterMetricFamily(f"leasecast_{name}", _HELP[name], labels=list(label_names))
        for (counter, values), n in sorted(figures.counters.items()):
            if counter == name:
                family.add_metric(list(values), n)
        yield family
    sockets = GaugeMetricFamily(
        "leasecast_sockets", "Open sockets by kind and gateway process.", labels=["kind", "process"]
    )
    for process, kinds in sorted(figures.sockets.items()):
        for kind, n in sorted(kinds.items()):
            sockets.add_metric([kind, process], n)
    yield sockets
    yield from figures.more


def _lease_seconds(figures: Deployment) -> Metric:
    """``leasecast_queue_lease_seconds``: from delivery to ack, per queue.

    The store counts each ack once, in the bucket of its length (a queue
    counter, ``gateway.store.leasing.LEASE_SECONDS``, labelled with the bound);
    Prometheus buckets are cumulative, so each bound here counts the acks at
    or under it.
    """
    family = HistogramMetricFamily(
        "leasecast_queue_lease_seconds",
        "Seconds from a message's delivery to its ack.",
        labels=["queue"],
    )
    bounds = [format_bound(b) for b in LEASE_SECONDS_BUCKETS] + ["+Inf"]
    per_bucket: dict[str, dict[str, int]] = {}
    sums: dict[str, int] = {}
    for (queue, name, label), n in figures.queue_counters.items():
        if name == LEASE_SECONDS:
            per_bucket.setdefault(queue, {})[label] = n
        elif name == LEASE_SECONDS_SUM:
            sums[queue] = n
    for queue in sorted(figures.queue_oldest):  # every queue
        counts = per_bucket.get(queue, {})
        running = 0
        buckets: list[tuple[str, float]] = []
        for bound in bounds:
            running += counts.get(bound, 0)
            buckets.append((bound, running))
        family.add_metric([queue], buckets, sum_value=sums.get(queue, 0) / 1000)
    return family


def render(figures: Deployment) -> bytes:
    """The Prometheus text exposition of ``figures``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(figures))
    return generate_latest(registry)


def scrape(process: ProcessMetrics) -> bytes:
    """Everything ``GET /metrics`` shows, from this process's figures
    (blocking: run it in a thread that may use Django's database connection)."""
    from django.db import connection

    registry = process.registry
    share = process.share
    if share is not None:
        try:
            share.flush(registry)  # this process's last second, too
        except Exception as exc:
            log.warning("metrics: Redis flush failed (%s: %s)", type(exc).__name__, exc)
        counters, sockets = share.read()
    else:
        counters, sockets = registry.totals(), {registry.process: registry.sockets()}
    with connection.cursor() as cursor:  # Django's: %s placeholders on SQLite too
        figures = read_queue_figures(cursor, time.time())
        figures.more.append(schedule_fired_family(cursor))
    figures.counters, figures.sockets = counters, sockets
    # Members of topics with presence: every process's, as Redis holds them
    # (gateway.topics.presence), else this one process's.
    members = (
        registry.presence()
        if share is None
        else shared_presence_counts(share.client, share.prefix, time.time())
    )
    figures.more.append(_presence_family(members))
    return render(figures)


def _presence_family(members: Mapping[str, int]) -> Metric:
    """``leasecast_topic_presence``: the subscriptions of each topic with presence."""
    family = GaugeMetricFamily(
        "leasecast_topic_presence",
        "Subscriptions of a topic with presence, on every gateway process.",
        labels=["topic"],
    )
    for topic, n in sorted(members.items()):
        family.add_metric([topic], n)
    return family
