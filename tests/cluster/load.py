"""Steady load on a deployment of separate hosts, and the ledger it is checked against.

The clients of the fault tests (tests/cluster/test_failover.py,
tests/cluster/test_partitions.py), all on the client host:

- :func:`producer`: enqueues one message at a time, each with its own
  idempotency key; one not confirmed is sent again with the same key.
- :func:`worker`: acks every delivery; an ack answered ``unavailable`` is sent again.
- :class:`Probe`: one enqueue after another on one gateway asked directly,
  the moments of each answer kept, so a fault's windows (when the gateway
  started to refuse, when it confirmed again) can be read off.
- :class:`Session`: a ``block`` subscriber on one gateway, keeping every
  item it got in order, and how it was closed.

The :class:`Ledger` keeps what the clients were told and what they received,
so a test can check that nothing confirmed was lost, that no confirmed ack
was undone, and that every answer was an allowed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from tests.cluster.deploy import Deployment
from tests.cluster.services import GATEWAY_PORT, open_socket, request
from tests.support.clients import Socket

__all__ = [
    "ACK_ANSWERS",
    "ENQUEUE_ANSWERS",
    "LOST_SOCKET",
    "OPEN_FAILURES",
    "Ledger",
    "Probe",
    "Session",
    "confirms_directly",
    "connect",
    "first_after",
    "producer",
    "queue_counts",
    "worker",
]

#: What an enqueue may be answered during a fault, and an ack.
ENQUEUE_ANSWERS = {"enqueued", "unavailable"}
ACK_ANSWERS = {"acked", "unavailable", "stale_receipt"}
#: Failures of a connection attempt while the deployment switches.
OPEN_FAILURES = (OSError, InvalidHandshake, TimeoutError)
LOST_SOCKET = (ConnectionError, ConnectionClosed, TimeoutError)


@dataclass
class Ledger:
    """What the clients were told and what they received, with the times of the answers."""

    #: key -> when its enqueue was answered ``enqueued``
    confirmed: dict[str, float] = field(default_factory=dict)
    #: id -> deliveries received
    delivered: Counter[str] = field(default_factory=Counter)
    #: every delivery received: (worker's name, id, its ``deliveries``, when)
    deliveries: list[tuple[str, str, int, float]] = field(default_factory=list)
    #: (id, ``deliveries``) of every delivery whose ack was sent at least once
    ack_sent: set[tuple[str, int]] = field(default_factory=set)
    #: id -> the ``deliveries`` count of the delivery whose ack was answered ``acked``
    acked: dict[str, int] = field(default_factory=dict)
    #: deliveries of a message after its ack was confirmed (an undone ack)
    undone: list[dict[str, Any]] = field(default_factory=list)
    #: answers by kind: ("enqueue", "enqueued"), ("ack", "stale_receipt")...
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: answers that are not allowed
    wrong: list[dict[str, Any]] = field(default_factory=list)
    #: (time the request was sent, time answered, kind, answer)
    events: list[tuple[float, float, str, str]] = field(default_factory=list)
    #: acks answered ``unavailable``, then ``stale_receipt`` when sent again: the first
    #: was applied after all (its commit reached the standby, its answer did not come)
    applied_unanswered: int = 0
    #: enqueues sent again with their key and answered ``duplicate``: the same story
    duplicates: int = 0
    refused_opens: int = 0
    closes: Counter[str] = field(default_factory=Counter)
    #: requests that got no answer in time (the socket is then given up)
    unanswered: Counter[str] = field(default_factory=Counter)

    def answer(self, kind: str, sent: float, reply: dict[str, Any], allowed: set[str]) -> str:
        """Record a reply; returns ``op`` or the error's ``code``."""
        outcome = reply["op"] if reply["op"] != "error" else str(reply.get("code"))
        self.answers[kind, outcome] += 1
        self.events.append((sent, time.time(), kind, outcome))
        if outcome not in allowed:
            self.wrong.append({"kind": kind, **reply})
        return outcome

    @property
    def lost(self) -> list[str]:
        """Keys confirmed and never delivered."""
        return sorted(set(self.confirmed) - set(self.delivered))

    @property
    def redelivered(self) -> int:
        """Deliveries beyond the first of each message."""
        return sum(self.delivered.values()) - len(self.delivered)


async def connect(
    d: Deployment,
    path: str,
    ledger: Ledger,
    stop: asyncio.Event,
    via: str | None = None,
    **options: Any,
) -> Socket | None:
    """A socket from the client host through haproxy (or to ``via``, a gateway's
    ``ws://`` base), retried while the deployment switches.

    ``options`` go to the WebSocket client (e.g. ``ping_interval``, ``ping_timeout``).
    """
    base = via or d.balancer.ws
    while not stop.is_set():
        try:
            return await open_socket(d.client, f"{base}{path}", d.token, **options)
        except OPEN_FAILURES:
            ledger.refused_opens += 1
            await asyncio.sleep(0.1)
    return None


async def producer(
    d: Deployment,
    queue: str,
    name: str,
    ledger: Ledger,
    stop: asyncio.Event,
    *,
    timeout: float = 15,
    via: str | None = None,
    **options: Any,
) -> None:
    """Enqueues one at a time, each with its own key; one not confirmed is sent again.

    A request unanswered after ``timeout`` seconds gives its socket up (the
    key is sent again on a new one); ``via`` and ``options`` as :func:`connect`'s.
    """
    n, pending = 0, None
    while not stop.is_set():
        s = await connect(d, "/ws/produce/", ledger, stop, via, **options)
        if s is None:
            return
        try:
            while not stop.is_set():
                if pending is None:
                    pending, n = f"{name}-{n}", n + 1
                sent = time.time()
                frame = {"op": "enqueue", "queue": queue, "body": {"id": pending}, "key": pending}
                try:
                    reply = await s.request(frame, timeout=timeout)
                except TimeoutError:
                    ledger.unanswered["enqueue"] += 1
                    raise
                if ledger.answer("enqueue", sent, reply, ENQUEUE_ANSWERS) == "enqueued":
                    ledger.confirmed[pending] = time.time()
                    ledger.duplicates += bool(reply.get("duplicate"))
                    pending = None
                else:  # unavailable: nothing applied, or applied and the key says so
                    await asyncio.sleep(0.05)
        except LOST_SOCKET:
            ledger.closes[f"producer {s.conn.close_code}"] += 1
            await s.abort()  # a peer that stopped answering: no closing handshake to wait for
        finally:
            await s.close()


async def worker(
    d: Deployment,
    queue: str,
    ledger: Ledger,
    done: asyncio.Event,
    *,
    visibility_timeout: float = 5,
    timeout: float = 15,
    via: str | None = None,
    name: str = "worker",
    freeze: asyncio.Event | None = None,
    **options: Any,
) -> None:
    """Acks every delivery; an ack answered ``unavailable`` is sent again (its lease stays).

    An ack unanswered after ``timeout`` seconds gives its socket up (the
    lease then comes back after ``visibility_timeout``); ``via`` and
    ``options`` as :func:`connect`'s; ``name`` labels its deliveries in the
    ledger. Once ``freeze`` is set, the worker acks nothing more: it keeps
    what it is delivered (its leases held) until ``done``, then drops its
    socket without a closing handshake.
    """
    path = f"/ws/queues/{queue}/?prefetch=10&visibility_timeout={visibility_timeout:g}"
    while not done.is_set() and not (freeze is not None and freeze.is_set()):
        s = await connect(d, path, ledger, done, via, **options)
        if s is None:
            return
        try:
            while not done.is_set():
                try:
                    frame = await s.next(timeout=0.2)
                except TimeoutError:
                    continue
                if frame["op"] != "deliver":
                    ledger.wrong.append({"kind": "unsolicited", **frame})
                    continue
                mid, count = frame["body"]["id"], frame["deliveries"]
                if mid in ledger.acked and count >= ledger.acked[mid]:
                    # Not an old frame overtaken by the ack: a lease taken after it.
                    ledger.undone.append(frame)
                ledger.delivered[mid] += 1
                ledger.deliveries.append((name, mid, count, time.time()))
                if freeze is not None and freeze.is_set():
                    continue
                retried = False
                while not done.is_set():
                    sent = time.time()
                    ledger.ack_sent.add((mid, count))
                    try:
                        ack = {"op": "ack", "receipt": frame["receipt"]}
                        reply = await s.request(ack, timeout=timeout)
                    except TimeoutError:
                        ledger.unanswered["ack"] += 1
                        raise
                    outcome = ledger.answer("ack", sent, reply, ACK_ANSWERS)
                    if outcome == "acked":
                        ledger.acked[mid] = count
                    elif outcome == "stale_receipt" and retried:
                        ledger.applied_unanswered += 1
                    if outcome != "unavailable":
                        break
                    retried = True
                    await asyncio.sleep(0.05)
        except LOST_SOCKET:
            ledger.closes[f"worker {s.conn.close_code}"] += 1
            await s.abort()  # a peer that stopped answering: no closing handshake to wait for
        finally:
            if freeze is not None and freeze.is_set():
                await s.abort()
            else:
                await s.close()


async def queue_counts(d: Deployment, queue: str) -> dict[str, int]:
    """The queue's counts asked through haproxy ({} if not answered 200)."""
    status, stats = await request(d.client, "GET", f"{d.balancer.http}/api/queues/{queue}", d.token)
    if status != 200:
        return {}
    return {k: stats[k] for k in ("visible", "in_flight", "delayed", "dead")}


async def confirms_directly(d: Deployment, index: int, queue: str, timeout: float = 30) -> float:
    """Seconds until gateway ``index``, asked directly, confirms an enqueue."""
    gw = d.gateways[index]
    started = time.monotonic()
    deadline = started + timeout
    key = f"direct-{index}"
    while time.monotonic() < deadline:
        try:
            s = await open_socket(
                d.client, f"ws://{gw.host.address}:{GATEWAY_PORT}/ws/produce/", d.token
            )
        except OPEN_FAILURES:
            await asyncio.sleep(0.1)
            continue
        try:
            frame = {"op": "enqueue", "queue": queue, "body": {"id": key}, "key": key}
            if (await s.request(frame))["op"] == "enqueued":
                return time.monotonic() - started
        except LOST_SOCKET:
            pass
        finally:
            await s.close()
        await asyncio.sleep(0.1)
    raise AssertionError(f"{gw.host} never confirmed an enqueue after the failover:\n{d.logs()}")


def first_after(ledger: Ledger, moment: float, kind: str, outcome: str) -> float | None:
    """When the first ``outcome`` of a ``kind`` request sent after ``moment`` was answered."""
    times = [
        done for sent, done, k, o in ledger.events if k == kind and o == outcome and sent > moment
    ]
    return min(times) if times else None


@dataclass
class Session:
    """One subscriber socket: what it was told and received, and how it ended."""

    socket: Socket
    gateway: int
    subscribed: dict[str, Any] | None = None
    items: list[tuple[int, Any]] = field(default_factory=list)  # (offset, body)
    dropped: int = 0
    close_code: int | None = None
    task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, d: Deployment, gateway: int, topic: str, resume: tuple[int, str] | None = None
    ) -> Session:
        url = f"ws://{d.gateways[gateway].host.address}:{GATEWAY_PORT}/ws/topics/{topic}/"
        url += "?on_full=block&capacity=100000&credit=1000000"
        if resume is not None:
            url += f"&since={resume[0]}&epoch={resume[1]}"
        session = cls(await open_socket(d.client, url, d.token), gateway)
        session.task = asyncio.create_task(session._read())
        return session

    async def _read(self) -> None:
        while True:
            try:
                frame = await self.socket.next(timeout=120)
            except (ConnectionError, TimeoutError):
                break
            if frame["op"] == "subscribed":
                self.subscribed = frame
            elif frame["op"] == "messages":
                self.dropped += frame["dropped"]
                self.items += [(item["offset"], item["body"]) for item in frame["items"]]
        self.close_code = self.socket.conn.close_code

    @property
    def bodies(self) -> list[int]:
        return [body for _, body in self.items]

    def holes(self) -> list[int]:
        """Offsets missing between the first and the last this socket received."""
        offsets = [offset for offset, _ in self.items]
        if not offsets:
            return []
        return sorted(set(range(offsets[0], offsets[-1] + 1)) - set(offsets))

    def missing(self) -> list[int]:
        """Published numbers missing between the first and the last this socket got."""
        numbers = [b for b in self.bodies if isinstance(b, int)]
        if not numbers:
            return []
        return sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))

    def in_order(self) -> bool:
        offsets = [offset for offset, _ in self.items]
        return all(a < b for a, b in itertools.pairwise(offsets))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.socket.close()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 5)


@dataclass
class Probe:
    """Enqueues on one gateway, asked directly from the client host, one after another.

    Each attempt is kept as (sent, answered, outcome): ``enqueued``, an error
    code, or the failure of the socket (``TimeoutError``, ``InvalidStatus``...),
    after which a new socket is opened. The probe's queue is its own and
    nobody consumes it; every key is distinct.
    """

    d: Deployment
    index: int
    queue: str
    #: seconds a request may wait for its answer
    timeout: float = 30.0
    attempts: list[tuple[float, float, str]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        url = f"ws://{self.d.gateways[self.index].host.address}:{GATEWAY_PORT}/ws/produce/"
        s: Socket | None = None
        n = 0
        while not stop.is_set():
            sent = time.time()
            try:
                if s is None:
                    s = await open_socket(self.d.client, url, self.d.token, timeout=self.timeout)
                key = f"probe{self.index}-{n}"
                frame = {"op": "enqueue", "queue": self.queue, "body": {"id": key}, "key": key}
                reply = await s.request(frame, timeout=self.timeout)
                outcome = reply["op"] if reply["op"] != "error" else str(reply.get("code"))
            except (*OPEN_FAILURES, *LOST_SOCKET) as exc:
                outcome = type(exc).__name__
                if s is not None:
                    await s.abort()
                s = None
            self.attempts.append((sent, time.time(), outcome))
            n += 1
            await asyncio.sleep(0.1)
        if s is not None:
            await s.close()

    def first(self, outcome: str, answered_after: float) -> float | None:
        """When the first attempt answered after ``answered_after`` got ``outcome``."""
        times = [done for _, done, o in self.attempts if o == outcome and done > answered_after]
        return min(times) if times else None

    def first_sent_after(self, moment: float, outcome: str) -> float | None:
        """When the first attempt sent after ``moment`` and answered ``outcome`` was answered."""
        times = [done for sent, done, o in self.attempts if o == outcome and sent > moment]
        return min(times) if times else None

    def outcomes_between(self, start: float, end: float) -> Counter[str]:
        """Outcomes of the attempts answered between ``start`` and ``end``."""
        return Counter(o for _, done, o in self.attempts if start <= done <= end)
