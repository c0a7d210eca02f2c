"""Live state for the dashboard: this process's snapshot, the other processes', and history.

Every second each gateway process that runs with a cross-process channel
layer (``REDIS_URL``) sends its snapshot (sockets, topics, queue counters) to
the group ``leasecast.dashboard``; every process keeps the latest snapshot of
each peer, so a dashboard served by any process shows all of them, labelled.
Queue counts come from the shared database, once, from the serving process.

Every process also keeps the last 15 minutes of rates (:class:`RateHistory`),
computed once a second from those same snapshots (its own and its peers'), so
a dashboard opened on any process draws history at once. No engine hook is
needed: queue rates are differences of the counters ``/api/stats`` carries,
topic and consumer rates are the subscribers' own one-second meters.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.conf import gateway_settings
from gateway.core.leases import parse_receipt
from gateway.core.wire import CloseCode
from gateway.engine import Engine
from gateway.runtime import Runtime
from gateway.runtime.layer import ProcessChannel
from gateway.runtime.metrics import Registry
from gateway.store import AllStats
from gateway.topics.broadcast import Broadcaster

__all__ = [
    "BUCKET",
    "Exchange",
    "RateHistory",
    "alerts",
    "drop_ratio",
    "process_snapshot",
]

log = logging.getLogger("leasecast.dashboard")

GROUP = "leasecast.dashboard"
#: Seconds between snapshots; a peer silent for STALE_AFTER is dropped from view.
INTERVAL = 1.0
STALE_AFTER = 5.0
#: Seconds per history sample, and samples kept: 15 minutes. Five-second
#: samples keep the first frame of a page with 200 queues well under a
#: megabyte (180 samples, not 900); the open sample is sent every second.
BUCKET = 5
KEEP = 180
#: Series per queue and per topic, in the order each sample's lists hold them.
QUEUE_SERIES = ("enqueued", "acked", "redelivered", "dead_lettered")
TOPIC_SERIES = ("published", "delivered", "dropped")
#: A consumer dropping more than this share of its messages is an alert.
DROP_ALERT = 0.01


def drop_ratio(socket: dict[str, Any]) -> float:
    """The share of a subscriber's messages dropped over its meters' last seconds."""
    rate, drops = float(socket.get("rate") or 0.0), float(socket.get("drop_rate") or 0.0)
    total = rate + drops
    return drops / total if total > 0 else 0.0


def consumer_key(process: str, socket: dict[str, Any]) -> str:
    """A subscriber socket's name across processes: ``PROCESS/ID``."""
    return f"{process}/{socket['id']}"


def subscriptions_of(socket: dict[str, Any]) -> list[dict[str, Any]]:
    """The topic subscriptions a described socket carries, each shaped as a
    subscriber socket's description (``id``, ``topic``, ``client``, ``policy``,
    rates): the socket itself for a subscriber socket or an event stream
    (``/sse/``), one per started topic
    for a multiplexed ``/ws/`` socket (``id`` ``SOCKET:TOPIC``), none otherwise."""
    kind = socket.get("kind")
    if kind in ("subscriber", "sse"):  # an event stream is a subscription too
        return [socket]
    if kind != "multiplex":
        return []
    return [
        {**sub, "id": f"{socket['id']}:{sub['topic']}", "client": socket.get("client")}
        for sub in socket.get("topics", ())
        if sub.get("state") != "starting"
    ]


def alerts(
    processes: list[dict[str, Any]], queues: Any, oldest_threshold: float
) -> list[dict[str, Any]]:
    """Every consumer above 1% drops and every queue whose oldest visible message is too old.

    Consumers first, worst first; then queues, oldest first.
    """
    found: list[dict[str, Any]] = []
    for process in processes:
        for socket in (s for each in process.get("sockets", ()) for s in subscriptions_of(each)):
            ratio = drop_ratio(socket)
            if ratio > DROP_ALERT:
                found.append(
                    {
                        "kind": "consumer",
                        "consumer": consumer_key(process["name"], socket),
                        "process": process["name"],
                        "socket": socket["id"],
                        "topic": socket.get("topic"),
                        "client": socket.get("client"),
                        "policy": socket.get("policy"),
                        "drop_ratio": ratio,
                        "drop_rate": socket.get("drop_rate", 0.0),
                    }
                )
    found.sort(key=lambda a: -a["drop_ratio"])
    stale = [
        {
            "kind": "queue",
            "queue": q["name"],
            "oldest_visible_age": q["oldest_visible_age"],
            "visible": q.get("visible", 0),
            "threshold": oldest_threshold,
        }
        for q in (queues if isinstance(queues, list) else ())
        if (q.get("oldest_visible_age") or 0.0) > oldest_threshold
    ]
    stale.sort(key=lambda a: -a["oldest_visible_age"])
    return found + stale


@dataclass
class _Open:
    """The sample being filled: sums of one-second rates, and how many seconds."""

    t: int
    seconds: int = 0
    queues: dict[str, list[float]] = field(default_factory=dict)
    topics: dict[str, list[float]] = field(default_factory=dict)
    consumers: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        n = max(1, self.seconds)

        def avg(values: list[float]) -> list[float]:
            return [round(v / n, 3) for v in values]

        return {
            "t": self.t,
            "seconds": self.seconds,
            "queues": {q: avg(v) for q, v in self.queues.items()},
            "topics": {t: avg(v) for t, v in self.topics.items()},
            # Only consumers that dropped: most never do, and 1,000 zeros a sample add up.
            "consumers": {c: round(v / n, 4) for c, v in self.consumers.items() if v > 0},
        }


class RateHistory:
    """Rates per queue, topic and consumer over the last 15 minutes, in 5-second samples.

    :meth:`observe` takes the processes' snapshots once a second. A queue's
    rates are the growth of its counters, summed over processes (a process
    that restarted starts from zero again, so a counter that fell counts from
    zero); a topic's deliveries and drops are its subscribers' meters summed
    over processes, its publishes the highest publish meter of any process
    (a publish relayed to every process is counted by each). Each sample is
    the average of the seconds it saw. A pure core: the clock is passed in.
    """

    def __init__(self, keep: int = KEEP, bucket: int = BUCKET) -> None:
        self.bucket = bucket
        self.samples: deque[dict[str, Any]] = deque(maxlen=keep)
        self.labels: dict[str, dict[str, Any]] = {}
        self._open: _Open | None = None
        self._counters: dict[str, tuple[float, dict[str, dict[str, int]]]] = {}

    def observe(self, processes: list[dict[str, Any]], now: float) -> None:
        """Add one second of rates from every process's latest snapshot."""
        start = int(now // self.bucket * self.bucket)
        if self._open is not None and self._open.t != start:
            self.samples.append(self._open.as_json())
            self._open = None
        if self._open is None:
            self._open = _Open(start)
        sample = self._open
        sample.seconds += 1
        queues: dict[str, list[float]] = {}
        topics: dict[str, list[float]] = {}
        live: set[str] = set()
        for process in processes:
            name = process["name"]
            counters: dict[str, dict[str, int]] = process.get("counters") or {}
            taken = float(process.get("time", now))
            before = self._counters.get(name)
            # A copy: the process's own counters are a live dict that keeps growing.
            self._counters[name] = (taken, {q: dict(c) for q, c in counters.items()})
            if before is not None and taken > before[0]:
                dt = taken - before[0]
                for queue, now_counts in counters.items():
                    old = before[1].get(queue, {})
                    row = queues.setdefault(queue, [0.0] * len(QUEUE_SERIES))
                    for i, key in enumerate(QUEUE_SERIES):
                        a, b = now_counts.get(key, 0), old.get(key, 0)
                        row[i] += (a - b if a >= b else a) / dt
            for topic in process.get("topics", ()):
                row = topics.setdefault(topic["name"], [0.0] * len(TOPIC_SERIES))
                row[0] = max(row[0], float(topic.get("publish_rate") or 0.0))
            for socket in (
                s for each in process.get("sockets", ()) for s in subscriptions_of(each)
            ):
                row = topics.setdefault(socket["topic"], [0.0] * len(TOPIC_SERIES))
                row[1] += float(socket.get("rate") or 0.0)
                row[2] += float(socket.get("drop_rate") or 0.0)
                key = consumer_key(name, socket)
                live.add(key)
                sample.consumers[key] = sample.consumers.get(key, 0.0) + drop_ratio(socket)
                self.labels[key] = {
                    "process": name,
                    "socket": socket["id"],
                    "topic": socket["topic"],
                    "client": socket.get("client"),
                    "policy": socket.get("policy"),
                }
        gone = {p["name"] for p in processes}
        for name in [n for n in self._counters if n not in gone]:
            del self._counters[name]
        for into, rates in ((sample.queues, queues), (sample.topics, topics)):
            for name, values in rates.items():
                total = into.setdefault(name, [0.0] * len(values))
                for i, v in enumerate(values):
                    total[i] += v
        # The heatmap shows connected consumers: forget the label of one that left.
        for key in [k for k in self.labels if k not in live]:
            del self.labels[key]

    def dropping_labels(self) -> dict[str, dict[str, Any]]:
        """Labels of the connected consumers that dropped in the window (the heatmap's rows).

        Not every subscriber's: with a thousand subscribers that would be most
        of each second's frame, for rows the page never draws.
        """
        keys: set[str] = set()
        for sample in self.samples:
            keys.update(sample["consumers"])
        if self._open is not None:
            keys.update(k for k, v in self._open.consumers.items() if v > 0)
        return {k: v for k, v in self.labels.items() if k in keys}

    def current(self) -> dict[str, Any] | None:
        """The sample still being filled (the newest seconds)."""
        return None if self._open is None else self._open.as_json()

    def since(self, t: float) -> list[dict[str, Any]]:
        """Closed samples that started at or after ``t``."""
        return [s for s in self.samples if s["t"] >= t]

    def as_json(self) -> dict[str, Any]:
        """Everything kept, for a page that just opened."""
        current = self.current()
        return {
            "bucket": self.bucket,
            "keep": self.samples.maxlen,
            "queue_series": QUEUE_SERIES,
            "topic_series": TOPIC_SERIES,
            "samples": [*self.samples, *([current] if current else [])],
        }


def process_snapshot(engine: Engine, broadcaster: Broadcaster, figures: Registry) -> dict[str, Any]:
    """This process's live state (no database query)."""
    return {
        **engine.describe(),
        "time": time.time(),
        "slow_consumers_closed": broadcaster.slow_consumers_closed,
        "relay": broadcaster.relay_figures(),
        # What this process's store transactions counted, whichever path
        # enqueued (staged commits and operators' requeues too): gateway.runtime.metrics.
        "counters": figures.queue_counters(),
        "topics": broadcaster.describe_topics(),
        "sockets": [_described(socket) for socket in engine.sockets],
    }


#: Messages a worker socket's row lists (what it runs now); a worker with a
#: prefetch of 1,000 shows its first ones and the count.
MAX_RUNNING = 20


def _described(socket: Any) -> dict[str, Any]:
    """A socket's own description; a worker's also lists the messages it holds.

    Message ids, not receipts (a receipt is the worker's to settle): the
    dashboard says which task each worker runs now from them.
    """
    described: dict[str, Any] = socket.describe()
    leases = getattr(socket, "leases", None)
    if described.get("kind") == "worker" and leases is not None:
        held = (parse_receipt(r) for r in leases.receipts()[:MAX_RUNNING])
        described["running"] = [p[0] for p in held if p is not None]
    return described


class Exchange:
    """Shares snapshots and disconnect requests between gateway processes.

    A part of the process's runtime (:meth:`for_runtime`, which the site
    registers with :func:`gateway.runtime.add_part`): every process shares its
    live state with the others' dashboards, whether or not it serves one.
    """

    def __init__(
        self,
        engine: Engine,
        broadcaster: Broadcaster,
        channel: ProcessChannel | None,
        figures: Registry,
    ) -> None:
        self.engine = engine
        self.broadcaster = broadcaster
        self.figures = figures
        self.peers: dict[str, dict[str, Any]] = {}
        self.history = RateHistory()
        #: the processes' snapshots as the history last saw them (one a second)
        self.latest: list[dict[str, Any]] = []
        self.channel = channel
        loop = asyncio.get_running_loop()
        self._sampler = loop.create_task(self._sample_loop())
        if self.channel is not None:
            self.channel.on("dashboard.", self._handle)
            self._joining = loop.create_task(self.channel.join(GROUP))
            self._sender = loop.create_task(self._send_loop())

    @classmethod
    def for_runtime(cls, runtime: Runtime) -> Exchange:
        """The exchange of ``runtime``'s process (a part it builds and closes)."""
        return cls(runtime.engine, runtime.broadcaster, runtime.channel, runtime.metrics.registry)

    def close(self) -> None:
        """Stop sampling and sending."""
        tasks = (self._sampler, getattr(self, "_joining", None), getattr(self, "_sender", None))
        for task in tasks:
            if task is not None:
                task.cancel()

    async def _sample_loop(self) -> None:
        """Once a second: every process's snapshot into the rate history."""
        while True:
            # On the second boundary, so each sample's seconds line up with the meters'.
            await asyncio.sleep(INTERVAL - math.fmod(time.time(), INTERVAL) + 0.01)
            try:
                self.latest = self.processes()
                self.history.observe(self.latest, time.time())
            except Exception:  # a bad peer snapshot must not stop the history
                log.exception("dashboard history sample failed")

    @property
    def oldest_alert(self) -> float:
        """Seconds an oldest visible message may wait before its queue is an alert."""
        return gateway_settings().dashboard_oldest_alert

    async def _handle(self, message: dict[str, Any]) -> None:
        if message["type"] == "dashboard.snapshot":
            snapshot = message["snapshot"]
            if snapshot["name"] != self.engine.process:
                self.peers[snapshot["name"]] = snapshot
        elif (
            message["type"] == "dashboard.disconnect" and message["process"] == self.engine.process
        ):
            self.disconnect_local(message["socket"])

    async def _send_loop(self) -> None:
        assert self.channel is not None
        while True:
            await asyncio.sleep(INTERVAL)
            try:
                snapshot = process_snapshot(self.engine, self.broadcaster, self.figures)
                await self.channel.layer.group_send(
                    GROUP, {"type": "dashboard.snapshot", "snapshot": snapshot}
                )
            except Exception as exc:
                log.debug("dashboard exchange send failed: %s", exc)

    def processes(self) -> list[dict[str, Any]]:
        """This process's snapshot and every peer heard from recently."""
        now = time.time()
        fresh = [p for p in self.peers.values() if now - p["time"] < STALE_AFTER]
        here = process_snapshot(self.engine, self.broadcaster, self.figures)
        return [here, *sorted(fresh, key=lambda p: p["name"])]

    def disconnect_local(self, sid: int) -> bool:
        """Close one socket of this process; True if it was found."""
        for socket in list(self.engine.sockets):
            if socket.sid == sid:
                socket.push_close(CloseCode.DISCONNECTED_BY_OPERATOR)
                return True
        return False

    async def disconnect(self, process: str, sid: int) -> bool:
        """Close a socket of any process (other processes are asked over the layer)."""
        if process == self.engine.process:
            return self.disconnect_local(sid)
        if self.channel is None or process not in self.peers:
            return False
        await self.channel.layer.group_send(
            GROUP, {"type": "dashboard.disconnect", "process": process, "socket": sid}
        )
        return True

    async def queues(self) -> list[dict[str, Any]]:
        """Counts per queue from the database (shared by every process)."""
        return [stats.as_json() for stats in await self.engine.call(AllStats())]
