"""One load generator for every system: work-queue cycles, paced latency, fan-out, resume.

Each system is an adapter (a :class:`QueuePeer`, a :class:`FanoutPeer` or a
:class:`ResumePeer`) that knows only how to enqueue one message, receive and
ack deliveries, publish one message and receive broadcasts, or fill a stream
and read it back from a position. The load itself (how many
producers, how many unconfirmed, how many workers with which prefetch, the
pacing, the clock, the latency stamps) is here, the same code for all of
them, so a difference in the figures is a difference in the systems.

Every body carries ``{"t": <send time>}``; latency is receipt time minus it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Ack",
    "FanoutPeer",
    "FanoutResult",
    "OnBodies",
    "OnMessage",
    "QueuePeer",
    "ResumePeer",
    "ResumeResult",
    "fanout",
    "percentile",
    "port_unavailable",
    "queue_cycles",
    "resume",
]

#: Acks one delivery (and waits for whatever confirmation the system gives),
#: or None where the system acks by itself when the handler returns.
Ack = Callable[[], Awaitable[Any]] | None
#: Called by a worker adapter for each delivery: the body's send time, its ack.
OnMessage = Callable[[float, Ack], None]
#: Called by a subscriber adapter with the send times of the bodies it received.
OnBodies = Callable[[list[float]], None]


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def port_unavailable(what: str, port: int, host: str = "127.0.0.1") -> str | None:
    """Why ``what`` at ``host:port`` cannot be reached, or None."""
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"{what} at {host}:{port} is not reachable: {exc}"


class PeerProducer(ABC):
    """One producer connection of a system."""

    @abstractmethod
    async def enqueue(self, body: dict[str, float]) -> None:
        """Enqueue ``body``; returns once the system confirmed it (as it confirms)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection."""


class PeerWorker(ABC):
    """One worker connection of a system, delivering to its ``on_message``."""

    @abstractmethod
    async def close(self) -> None:
        """Stop taking deliveries and close the connection."""


class QueuePeer(ABC):
    """A durable work queue as the load generator sees it."""

    #: the row's name in the tables
    name: str = ""
    #: what a confirmation means and when the system fsyncs (docs/benchmarks.md)
    durability: str = ""

    async def start(self) -> None:  # noqa: B027 - most adapters need nothing here
        """Connect, create what a run needs once."""

    async def close(self) -> None:  # noqa: B027
        """Release what :meth:`start` made."""

    @abstractmethod
    async def new_queue(self) -> str:
        """A fresh, empty queue for one measurement."""

    async def drop_queue(self, queue: str) -> None:  # noqa: B027
        """Remove ``queue`` after its measurement."""

    @abstractmethod
    async def producer(self, queue: str) -> PeerProducer:
        """A connected producer for ``queue``."""

    @abstractmethod
    async def worker(self, queue: str, prefetch: int, on_message: OnMessage) -> PeerWorker:
        """A connected worker of ``queue`` holding at most ``prefetch`` unacked deliveries."""

    async def drained(self, queue: str) -> None:  # noqa: B027
        """Return once ``queue`` holds nothing, where acks are not confirmed one by one.

        Systems whose ack is not answered (JetStream, pgqueuer's completion
        buffer) stop the clock here, when the server says the queue is empty.
        """

    def server_pids(self) -> list[int]:
        """The server processes whose CPU counts for this system (may be empty)."""
        return []

    def server_cpu(self) -> float | None:
        """CPU seconds of the server so far, or None when its processes cannot be seen."""
        from bench.procstat import cpu_of

        pids = self.server_pids()
        return cpu_of(pids) if pids else None

    def database_cpu(self) -> float | None:
        """CPU seconds so far of the PostgreSQL backends serving this system alone
        (its own database's sessions), or None: then the whole server counts."""
        return None


async def queue_cycles(
    peer: QueuePeer,
    n: int,
    *,
    producers: int,
    window: int,
    workers: int,
    prefetch: int,
    pace: float = 0,
    latencies: list[float] | None = None,
    timeout: float = 600,
) -> float:
    """``n`` cycles (enqueue, delivery, ack) on a fresh queue; seconds to the last ack.

    ``producers`` connections each enqueue their share with up to ``window``
    unconfirmed (one task per enqueue, as concurrent application code makes
    them); ``workers`` connections each hold up to ``prefetch`` deliveries
    and ack each in its own task. ``pace`` > 0 enqueues at that many
    messages/s in all. The clock runs from the first enqueue to the last
    confirmed ack (for systems that do not confirm acks, until
    :meth:`QueuePeer.drained`).
    """
    queue = await peer.new_queue()
    done = asyncio.Event()
    acked = 0
    failures: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def counted() -> None:
        nonlocal acked
        acked += 1
        if acked >= n:
            done.set()

    async def acking(ack: Callable[[], Awaitable[Any]]) -> None:
        try:
            await ack()
        except Exception as exc:  # reported after the run
            failures.append(exc)
            done.set()
            return
        counted()

    def on_message(sent: float, ack: Ack) -> None:
        if latencies is not None:
            latencies.append(time.time() - sent)
        if ack is None:
            counted()
        else:
            spawn(acking(ack))

    consumers = [await peer.worker(queue, prefetch, on_message) for _ in range(workers)]
    senders = [await peer.producer(queue) for _ in range(producers)]
    await asyncio.sleep(0.2)  # subscriptions registered everywhere

    async def produce(k: int, count: int) -> None:
        gate = asyncio.Semaphore(window)
        sender = senders[k]

        async def one() -> None:
            try:
                await sender.enqueue({"t": time.time()})
            except Exception as exc:  # reported after the run
                failures.append(exc)
                done.set()
            finally:
                gate.release()

        for i in range(count):
            await gate.acquire()
            if pace:
                # Producer k sends at times (i * producers + k) / pace: together, `pace`/s.
                due = start + (i * producers + k) / pace
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            spawn(one())

    shares = [n // producers + (1 if k < n % producers else 0) for k in range(producers)]
    start = time.perf_counter()
    feeding = [asyncio.create_task(produce(k, shares[k])) for k in range(producers)]
    try:
        await asyncio.wait_for(done.wait(), timeout)
        if not failures:
            await asyncio.wait_for(peer.drained(queue), timeout)
    finally:
        seconds = time.perf_counter() - start
        for task in feeding:
            task.cancel()
        await asyncio.gather(*feeding, return_exceptions=True)
        # Confirmations still in flight (none, unless the run failed).
        if tasks:
            await asyncio.wait(list(tasks), timeout=10)
        closing = [sender.close() for sender in senders] + [c.close() for c in consumers]
        await asyncio.gather(*closing, return_exceptions=True)
        with contextlib.suppress(Exception):
            await peer.drop_queue(queue)
    if failures:
        raise RuntimeError(f"{len(failures)} calls failed, first: {failures[0]!r}")
    return seconds


# -- fan-out ------------------------------------------------------------------


class PeerPublisher(ABC):
    """One publisher connection of a broadcast system."""

    @abstractmethod
    async def publish(self, topic: str, body: dict[str, float]) -> None:
        """Publish ``body``; returns when the system accepted it (as it says so)."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection."""


class PeerSubscriber(ABC):
    """One subscriber connection, delivering to its ``on_bodies``."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection."""


class FanoutPeer(ABC):
    """A broadcast system as the load generator sees it."""

    name: str = ""
    #: what a subscriber is promised (at most once, buffers, credit...)
    delivery: str = ""

    async def start(self) -> None:  # noqa: B027
        """Start or connect to the server."""

    async def close(self) -> None:  # noqa: B027
        """Stop what :meth:`start` started."""

    @abstractmethod
    async def subscriber(self, topic: str, expected: int, on_bodies: OnBodies) -> PeerSubscriber:
        """A subscriber of ``topic``, subscribed when this returns."""

    @abstractmethod
    async def publisher(self) -> PeerPublisher:
        """A connected publisher."""

    def server_pids(self) -> list[int]:
        """The server processes whose CPU counts for this system (may be empty)."""
        return []


@dataclass
class FanoutResult:
    """One fan-out measurement."""

    subscribers: int
    messages: int
    delivered: int
    seconds: float
    latencies: list[float] = field(default_factory=list)

    @property
    def deliveries_per_s(self) -> float:
        return self.delivered / self.seconds if self.seconds else 0.0


async def fanout(
    peer: FanoutPeer,
    n_subs: int,
    n_msgs: int,
    *,
    window: int = 100,
    connect_limit: int = 50,
    timeout: float = 60,
) -> FanoutResult:
    """``n_subs`` subscribers of a fresh topic, ``n_msgs`` publishes, up to ``window`` unconfirmed.

    Deliveries/s counts bodies received by all subscribers together, from
    the first publish to the last receipt; what never arrived within
    ``timeout`` is missing from ``delivered``.
    """
    topic = f"bench{int(time.time() * 1000)}"
    latencies: list[float] = []
    counts = [0] * n_subs
    remaining = n_subs
    finished = asyncio.Event()
    last = 0.0

    def receiver(k: int) -> OnBodies:
        def on_bodies(sent: list[float]) -> None:
            nonlocal remaining, last
            now = time.time()
            latencies.extend(now - t for t in sent)
            before = counts[k]
            counts[k] += len(sent)
            last = now
            if before < n_msgs <= counts[k]:
                remaining -= 1
                if remaining == 0:
                    finished.set()

        return on_bodies

    handshakes = asyncio.Semaphore(connect_limit)

    async def subscribe(k: int) -> PeerSubscriber:
        async with handshakes:
            return await peer.subscriber(topic, n_msgs, receiver(k))

    subs = await asyncio.gather(*(subscribe(k) for k in range(n_subs)))
    await asyncio.sleep(0.5)  # every subscription registered in the server
    pub = await peer.publisher()
    gate = asyncio.Semaphore(window)
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        try:
            await pub.publish(topic, {"t": time.time()})
        finally:
            gate.release()

    start = time.time()
    try:
        for _ in range(n_msgs):
            await gate.acquire()
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
        with contextlib.suppress(TimeoutError):  # then report what arrived
            await asyncio.wait_for(finished.wait(), timeout)
    finally:
        with contextlib.suppress(Exception):
            await pub.close()
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.close()
    return FanoutResult(n_subs, n_msgs, sum(counts), max(last - start, 1e-9), latencies)


# -- resume: a subscriber reads back what it missed


class ResumePeer(ABC):
    """A stream that keeps what was published, read back from a position."""

    name: str
    #: what is kept, where, and what a reader is promised
    delivery: str

    async def start(self) -> None:  # noqa: B027
        """Connect, once for the run."""

    async def close(self) -> None:  # noqa: B027
        """Disconnect."""

    @abstractmethod
    async def fill(self, missed: int) -> Any:
        """A fresh stream holding ``missed`` messages published while nobody
        listened, bodies ``{"m": 1}`` to ``{"m": missed}`` in order, each
        confirmed by the server; returns the position just before the first."""

    @abstractmethod
    async def replay(self, position: Any, missed: int) -> list[int]:
        """Subscribe from ``position`` (handshake included) and return the
        ``m`` of the first ``missed`` messages received, in the order received."""

    def server_pids(self) -> list[int]:
        """The server processes whose CPU counts for this system (may be empty)."""
        return []


@dataclass
class ResumeResult:
    """One resume: how long reading back ``missed`` messages took, and whether
    they came each once and in order."""

    missed: int
    received: int
    in_order: bool
    seconds: float

    @property
    def messages_per_s(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0


async def resume(
    peer: ResumePeer, position: Any, missed: int, timeout: float = 120
) -> ResumeResult:
    """Time reading back the ``missed`` messages after ``position`` (from
    :meth:`ResumePeer.fill`): from the subscribe call (connection and
    handshake included) to the receipt of the last one."""
    start = time.perf_counter()
    got = await asyncio.wait_for(peer.replay(position, missed), timeout)
    seconds = time.perf_counter() - start
    return ResumeResult(missed, len(got), got == list(range(1, missed + 1)), seconds)
