"""Network partitions between separate hosts, under load: nothing confirmed is lost.

The deployment of tests/cluster/deploy.py (one for the module): a client
host, haproxy on a balancer host, two gateway hosts, PostgreSQL and Redis on
hosts of their own. Under steady load, gateway gw1 is cut off (every packet
dropped both ways, nothing refused: tests/cluster/partition.py) from the
database host, then from the Redis host, then from the client and balancer
hosts, then from the other gateway; each cut is healed and the gateways must
recover by themselves. Each time the ledger of what the clients were told is
checked against what they received:

- every enqueue answered ``enqueued`` is delivered (lost: 0), no message
  whose ack was answered ``acked`` is delivered again, and every answer is
  the right one or ``unavailable`` (an ack may be ``stale_receipt``: its
  lease was taken back); leases the cut gateway's workers held come back
  elsewhere after their visibility timeout;
- a ``block`` subscriber gets every confirmed publish in offset order with
  no hole, or is told (closed with 4008 or 4409), never a silent gap, and no
  two publishes are confirmed at one offset;
- what the partition did not touch goes on working during it.

The windows (how long until the cut gateway answers ``unavailable``, until
the balancer takes it out, until it confirms again after the heal) are
printed as ``PARTITION ...`` lines, never asserted on: docs/reliability.md
has them over several runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.cluster.deploy import Deployment
from tests.cluster.load import (
    LOST_SOCKET,
    OPEN_FAILURES,
    Ledger,
    Probe,
    Session,
    confirms_directly,
    producer,
    queue_counts,
    worker,
)
from tests.cluster.partition import Partition, partitioned
from tests.cluster.services import GATEWAY_PORT, open_socket, request
from tests.support.clients import Socket, unique
from tests.support.waiting import wait_until

# Alone, after the parallel run: hosts, databases and Sentinels of their own.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

#: Seconds a cut lasts at least: past a lease's visibility timeout.
HOLD = 8.0
#: Seconds a cut lasts at most while the test waits for its effect.
MAX_HOLD = 30.0
#: The workers' visibility timeout (seconds).
VISIBILITY = 5
#: Close codes that tell a subscriber it missed something (so not a silent gap).
TOLD = {4008, 4409}
#: Transport failures a client may see from a host it cannot reach.
UNREACHABLE = {exc.__name__ for exc in (*OPEN_FAILURES, *LOST_SOCKET)}


def ws_of(d: Deployment, index: int) -> str:
    """The ``ws://`` base of gateway ``index``, asked directly (not through haproxy)."""
    return f"ws://{d.gateways[index].host.address}:{GATEWAY_PORT}"


async def hold(cut: Partition, done: Callable[[], bool]) -> None:
    """Keep the cut at least :data:`HOLD` seconds, then until ``done()`` (at most
    :data:`MAX_HOLD`: the assertions after the heal tell what did not happen)."""
    assert cut.cut_at is not None
    while time.time() - cut.cut_at < MAX_HOLD:
        if time.time() - cut.cut_at >= HOLD and done():
            return
        await asyncio.sleep(0.05)


def since(t: float | None, moment: float | None) -> str:
    return "-" if t is None or moment is None else f"{t - moment:.2f} s"


@dataclass
class Traffic:
    """Producers and workers on one queue, and an enqueue probe on each gateway."""

    d: Deployment
    queue: str
    ledger: Ledger = field(default_factory=Ledger)
    probes: list[Probe] = field(default_factory=list)
    producers: list[asyncio.Task[None]] = field(default_factory=list)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    probing: list[asyncio.Task[None]] = field(default_factory=list)
    stop_producing: asyncio.Event = field(default_factory=asyncio.Event)
    stop_consuming: asyncio.Event = field(default_factory=asyncio.Event)
    stop_probing: asyncio.Event = field(default_factory=asyncio.Event)
    #: set: the workers named in ``frozen`` ack nothing more (see ``load.worker``)
    freeze: asyncio.Event = field(default_factory=asyncio.Event)
    #: set: the frozen workers leave (dropping their sockets)
    thaw: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def start(
        cls,
        d: Deployment,
        queue: str,
        *,
        producers: int = 2,
        workers: Mapping[str, str | None],
        frozen: tuple[str, ...] = (),
        **options: Any,
    ) -> Traffic:
        """``producers`` through haproxy; a worker per name of ``workers``, on the
        ``ws://`` base given (None: through haproxy), those named in ``frozen``
        stopping acking when :attr:`freeze` is set; ``options`` for every client."""
        t = cls(d, queue)
        t.probes = [Probe(d, i, unique(f"probe{i}-")) for i in range(len(d.gateways))]
        t.probing = [asyncio.create_task(p.run(t.stop_probing)) for p in t.probes]
        t.workers = [
            asyncio.create_task(
                worker(
                    d,
                    queue,
                    t.ledger,
                    t.thaw if name in frozen else t.stop_consuming,
                    visibility_timeout=VISIBILITY,
                    via=via,
                    name=name,
                    freeze=t.freeze if name in frozen else None,
                    **options,
                )
            )
            for name, via in workers.items()
        ]
        t.producers = [
            asyncio.create_task(producer(d, queue, f"p{k}", t.ledger, t.stop_producing, **options))
            for k in range(producers)
        ]
        return t

    async def confirmed(self, n: int) -> None:
        """Until ``n`` enqueues are confirmed in all."""
        await wait_until(
            lambda: len(self.ledger.confirmed) >= n,
            f"{n} enqueues confirmed ({len(self.ledger.confirmed)}):\n{self.d.logs()}",
        )

    async def finish(self) -> dict[str, int]:
        """Stop producing, drain (every confirmed message delivered, the queue
        empty: a lease lost in the fault comes back after its visibility
        timeout), stop everything; the queue's last counts."""
        self.stop_producing.set()
        self.thaw.set()
        await asyncio.wait_for(asyncio.gather(*self.producers), 60)
        deadline = time.monotonic() + 60
        counts: dict[str, int] = {}
        while time.monotonic() < deadline:
            counts = await queue_counts(self.d, self.queue)
            if (
                not self.ledger.lost
                and counts
                and not any(counts[k] for k in ("visible", "in_flight", "delayed"))
            ):
                break
            await asyncio.sleep(0.2)
        await self.stop()
        for task in [*self.producers, *self.workers, *self.probing]:
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return counts

    async def stop(self) -> None:
        """Stop every client (idempotent)."""
        for event in (self.stop_producing, self.stop_consuming, self.stop_probing, self.thaw):
            event.set()
        tasks = [*self.producers, *self.workers, *self.probing]
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 90)

    def summary(self) -> str:
        ledger = self.ledger
        return (
            f"{len(ledger.confirmed)} enqueues confirmed, {len(ledger.delivered)} distinct "
            f"messages delivered, {ledger.redelivered} redeliveries, {len(ledger.acked)} acks "
            f"confirmed; answers {dict(ledger.answers)}; unanswered {dict(ledger.unanswered)}; "
            f"{ledger.refused_opens} refused socket opens; closes {dict(ledger.closes)}"
        )

    def check(self, counts: dict[str, int]) -> None:
        """The ledger's promises: nothing lost, no ack undone, no wrong answer, all done."""
        ledger, summary = self.ledger, self.summary()
        assert not ledger.lost, f"confirmed, never delivered: {ledger.lost[:20]}; {summary}"
        assert not ledger.undone, f"acked, then delivered again: {ledger.undone[:5]}; {summary}"
        assert not ledger.wrong, f"answers neither right nor unavailable: {ledger.wrong[:5]}"
        assert counts == {"visible": 0, "in_flight": 0, "delayed": 0, "dead": 0}, (counts, summary)

    def unacked(self, name: str) -> list[tuple[str, int]]:
        """(id, deliveries) of what worker ``name`` was delivered and never sent an ack for."""
        return [
            (mid, count)
            for who, mid, count, _ in self.ledger.deliveries
            if who == name and (mid, count) not in self.ledger.ack_sent
        ]

    def taken_back(self, name: str, moment: float) -> list[tuple[str, int]]:
        """Leases worker ``name`` held at ``moment`` whose ack was never confirmed:
        (id, deliveries) of deliveries it got before then."""
        held = []
        for who, mid, count, at in self.ledger.deliveries:
            if who == name and at < moment and self.ledger.acked.get(mid) != count:
                held.append((mid, count))
        return held


def open_transactions(d: Deployment) -> list[tuple[str, float]]:
    """gw1's sessions in a transaction on the database, as the database sees them:
    (state, seconds since the transaction began)."""
    rows = d.primary.query(
        "SELECT state, extract(epoch FROM now() - xact_start)::float FROM pg_stat_activity "
        "WHERE host(client_addr) = %s AND xact_start IS NOT NULL",
        (d.gateways[0].host.address,),
        database="leasecast",
    )
    return [(str(state), round(float(age), 1)) for state, age in rows]


async def refused_socket(d: Deployment, index: int, token: str) -> tuple[dict[str, Any], int]:
    """Open a socket on gateway ``index`` with ``token``: its first frame and its close code."""
    s = await open_socket(d.client, f"{ws_of(d, index)}/ws/produce/", token, timeout=30)
    try:
        frame = await s.next(timeout=30)
        with contextlib.suppress(ConnectionError):
            await s.next(timeout=30)
        return frame, s.conn.close_code or 0
    finally:
        await s.close()


def no_traceback(d: Deployment) -> None:
    for gw in d.gateways:  # failures were answered, not crashed on
        assert "Traceback" not in gw.log_text(), gw.log_text()[-4000:]


async def test_a_gateway_cut_from_the_database_answers_unavailable_and_recovers(
    module_hosts: Deployment,
) -> None:
    d = module_hosts
    # A token gw1 has not seen yet: it must ask the database to check it.
    fresh = await asyncio.to_thread(d.gateways[0].issue_token, "admin", name=unique("fresh"))
    # Worker "held", on gw1, stops acking just before the cut: the leases it
    # holds then can be neither acked nor released while gw1 cannot reach the
    # database, and must go to worker gw2 when their visibility timeout passes.
    workers = {"gw1": ws_of(d, 0), "held": ws_of(d, 0), "gw2": ws_of(d, 1)}
    t = Traffic.start(d, unique("cutdb"), workers=workers, frozen=("held",))
    try:
        await t.confirmed(150)
        t.freeze.set()
        await wait_until(lambda: t.unacked("held"), "worker 'held' holding a lease")
        before = len(t.ledger.confirmed)
        with partitioned([d.gateways[0].host], [d.primary.host]) as cut:
            assert cut.cut_at is not None
            moment = cut.cut_at
            held = t.unacked("held")
            # gw1's transactions as the database sees them, through the cut.
            seen: list[tuple[float, list[tuple[str, float]]]] = []

            async def watch_transactions() -> None:
                while True:
                    seen.append((time.time(), await asyncio.to_thread(open_transactions, d)))
                    await asyncio.sleep(0.25)

            watching = asyncio.create_task(watch_transactions())

            def on_gw2() -> dict[tuple[str, int], float]:
                """When each held lease was delivered to worker gw2 (with a higher count)."""
                found: dict[tuple[str, int], float] = {}
                for who, mid, count, at in t.ledger.deliveries:
                    for lease in held:
                        if who == "gw2" and mid == lease[0] and count > lease[1]:
                            found.setdefault(lease, at)
                return found

            await hold(
                cut,
                lambda: (
                    t.probes[0].first("unavailable", moment) is not None
                    and len(on_gw2()) == len(held)
                ),
            )
            # The token cannot be checked: a socket is told so and closed with 4503
            # (retry), an HTTP request answered 503 (before: HTTP 500 and a traceback).
            frame, code = await refused_socket(d, 0, fresh)
            status, body = await request(
                d.client, "GET", f"{d.gateways[0].http}/api/queues/{t.queue}", fresh
            )
            taken_over = on_gw2()

            # The database gives up gw1's session by itself, and with it the
            # transaction the cut interrupted and its row locks (before: held
            # for as long as the cut lasted).
            async def released() -> bool:
                return not await asyncio.to_thread(open_transactions, d)

            await wait_until(released, "the database dropping gw1's open transactions")
            watching.cancel()
            # Whether the cut caught gw1 in the middle of a batch's transaction, and
            # when the database let it go.
            stranded = seen[0][1] if seen else []
            released_at = min((at for at, rows in seen if not rows), default=time.time())
        assert cut.healed_at is not None
        healed = cut.healed_at
        t.thaw.set()  # the frozen worker leaves
        # gw1 confirms again by itself, no restart.
        await wait_until(
            lambda: t.probes[0].first("enqueued", healed) is not None, "gw1 confirming again"
        )
        await t.confirmed(len(t.ledger.confirmed) + 100)
        counts = await t.finish()
    finally:
        await t.stop()

    gw1, gw2 = t.probes
    detected = gw1.first("unavailable", moment)
    recovered = gw1.first("enqueued", healed)
    during = gw1.outcomes_between(moment, healed)
    print(
        f"\nPARTITION gw1|db: cut {healed - moment:.1f} s; gw1 answered 'unavailable' from "
        f"{since(detected, moment)} after the cut, confirmed again {since(recovered, healed)} "
        f"after the heal; gw1's answers during the cut {dict(during)}; gw2's "
        f"{dict(gw2.outcomes_between(moment, healed))}; worker 'held' on gw1 held {len(held)} "
        f"leases at the cut, delivered to worker gw2 "
        f"{[since(at, moment) for at in sorted(taken_over.values())]} after the cut; gw1's "
        f"transactions open on the database at the cut: {stranded}, none from "
        f"{since(released_at, moment)} on; {before} confirmed before the cut; "
        f"{t.summary()}"
    )
    t.check(counts)
    assert (frame.get("code"), code) == ("unavailable", 4503), (frame, code)
    assert (status, body.get("error")) == (503, "unavailable"), (status, body)
    # The cut gateway said so, and said nothing else; the other never noticed.
    assert detected is not None, f"gw1 never answered 'unavailable' during the cut: {dict(during)}"
    assert set(during) <= {"enqueued", "unavailable"}, during
    assert set(gw2.outcomes_between(moment, healed)) == {"enqueued"}
    # The leases the cut gateway held came back, during the cut, on the other.
    assert held and set(taken_over) == set(held), (held, taken_over)
    no_traceback(d)


def expected(s: Session, confirmed: dict[str, tuple[str, int]]) -> set[str]:
    """The confirmed publishes a subscriber must get: every one from the first it got on."""
    first = s.items[0][0] if s.items else 0
    return {body for body, (_, offset) in confirmed.items() if offset >= first}


@dataclass
class Publisher:
    """Publishes ``g<index>-0``, ``-1``... on one gateway directly; what it was told."""

    d: Deployment
    index: int
    topic: str
    #: body -> (epoch, offset) of each confirmed publish
    confirmed: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: (sent, answered, outcome) of every attempt
    attempts: list[tuple[float, float, str]] = field(default_factory=list)
    wrong: list[dict[str, Any]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        """One publish at a time (one not confirmed is sent again, under a new
        number: the protocol has no key for publishes)."""
        s: Socket | None = None
        n = 0
        while not stop.is_set():
            sent = time.time()
            body = f"g{self.index}-{n}"
            try:
                if s is None:
                    s = await open_socket(self.d.client, f"{ws_of(self.d, self.index)}/ws/produce/",
                                          self.d.token, timeout=10)  # fmt: skip
                frame = {"op": "publish", "topic": self.topic, "body": body}
                reply = await s.request(frame, timeout=60)
                outcome = reply["op"] if reply["op"] != "error" else str(reply.get("code"))
                if outcome == "published":
                    self.confirmed[body] = (reply["epoch"], reply["offset"])
                elif outcome not in ("unavailable", "backpressure"):
                    self.wrong.append(reply)
            except (*OPEN_FAILURES, *LOST_SOCKET) as exc:
                outcome = type(exc).__name__
                if s is not None:
                    await s.abort()
                s = None
            self.attempts.append((sent, time.time(), outcome))
            n += 1
            await asyncio.sleep(0.05)
        if s is not None:
            await s.close()

    def first(self, outcome: str, answered_after: float) -> float | None:
        times = [done for _, done, o in self.attempts if o == outcome and done > answered_after]
        return min(times) if times else None


async def test_a_gateway_cut_from_redis_never_gives_a_subscriber_a_silent_gap(
    module_hosts: Deployment,
) -> None:
    d = module_hosts
    topic = unique("cutredis")
    sessions = [await Session.open(d, i, topic) for i in (0, 1)]
    publishers = [Publisher(d, i, topic) for i in (0, 1)]
    stop = asyncio.Event()
    publishing: list[asyncio.Task[None]] = []
    t = Traffic.start(d, unique("cutredisq"), producers=1, workers={"lb": None})
    try:
        publishing = [asyncio.create_task(p.run(stop)) for p in publishers]
        await wait_until(
            lambda: (
                all(len(p.confirmed) >= 20 for p in publishers) and all(s.items for s in sessions)
            ),
            "publishes confirmed and received",
        )
        await t.confirmed(50)
        with partitioned([d.gateways[0].host], [d.redis.host]) as cut:
            assert cut.cut_at is not None
            moment = cut.cut_at
            at_cut = len(publishers[1].confirmed)

            def answered_in_cut() -> list[tuple[float, float, str]]:
                return [a for a in publishers[0].attempts if a[0] > moment]

            # Until gw1 has answered publishes sent during the cut, and gw2 has
            # gone on publishing meanwhile.
            await hold(
                cut,
                lambda: len(answered_in_cut()) >= 2 and len(publishers[1].confirmed) >= at_cut + 20,
            )
            told_in_cut = answered_in_cut()
        assert cut.healed_at is not None
        healed = cut.healed_at
        during_gw2 = len(publishers[1].confirmed) - at_cut
        # gw1 publishes again by itself.
        await wait_until(
            lambda: publishers[0].first("published", healed) is not None, "gw1 publishing again"
        )
        recovered = publishers[0].first("published", healed)
        count = len(publishers[0].confirmed)
        await wait_until(lambda: len(publishers[0].confirmed) >= count + 20, "gw1 publishing on")
        stop.set()
        await asyncio.wait_for(asyncio.gather(*publishing), 90)
        confirmed = {**publishers[0].confirmed, **publishers[1].confirmed}

        def caught_up() -> bool:
            return all(
                s.close_code is not None or expected(s, confirmed) <= set(s.bodies)
                for s in sessions
            )

        await wait_until(caught_up, "every confirmed publish delivered or the subscriber told")
        closed = [s.close_code for s in sessions]  # before the test closes them
        counts = await t.finish()
    finally:
        stop.set()
        await asyncio.gather(*publishing, return_exceptions=True)
        await t.stop()
        for s in sessions:
            await s.close()

    by_offset = Counter(confirmed.values())
    # Publishes answered ``unavailable`` whose command reached Redis after all.
    unconfirmed = sorted({b for s in sessions for b in s.bodies} - set(confirmed))
    answered = [(done, o) for sent, done, o in publishers[0].attempts if sent < healed < done]
    outcomes = [Counter(o for _, done, o in p.attempts if moment <= done) for p in publishers]
    print(
        f"\nPARTITION gw1|redis: cut {healed - moment:.1f} s; gw1's answers to publishes sent "
        f"in the cut, before the heal: "
        f"{[(f'{done - moment:.2f} s', o) for sent, done, o in told_in_cut if done < healed]}"
        f"; gw1's publishes pending at the "
        f"heal were answered {[(f'{done - healed:.2f} s', o) for done, o in answered]} after "
        f"it; gw1's first publish confirmed "
        f"{since(recovered, healed)} after the heal; publish outcomes after the cut: gw1 "
        f"{dict(outcomes[0])}, gw2 {dict(outcomes[1])} ({during_gw2} confirmed by gw2 during "
        f"the cut); subscribers got {[len(s.items) for s in sessions]} items, closed "
        f"{closed}, dropped {[s.dropped for s in sessions]}, and {len(unconfirmed)} publishes "
        f"not confirmed ({unconfirmed[:5]}); "
        f"{len(confirmed)} publishes confirmed; queue: {t.summary()}"
    )
    assert not [p.wrong for p in publishers if p.wrong], [p.wrong for p in publishers]
    # No two publishes were confirmed at one place in the topic.
    assert all(n == 1 for n in by_offset.values()), [k for k, n in by_offset.items() if n > 1]
    for s, code in zip(sessions, closed, strict=True):
        assert s.in_order() and not s.holes() and s.dropped == 0, (s.items[-20:], code)
        # What it got is what was confirmed there.
        got = {body: offset for offset, body in s.items}
        for body, offset in got.items():
            if body in confirmed:
                assert confirmed[body][1] == offset, (body, offset, confirmed[body])
        if code is None:
            missing = expected(s, confirmed) - set(got)
            assert not missing, sorted(missing)[:10]
        else:
            assert code in TOLD, code
    # gw2 never depended on gw1: it published throughout the cut.
    assert during_gw2 > 0
    t.check(counts)
    no_traceback(d)
    # gw1 answered publishes during the cut (``unavailable``), it did not hang.
    assert len(told_in_cut) >= 2, told_in_cut


async def test_a_gateway_cut_from_its_clients_is_taken_out_and_its_leases_come_back(
    module_hosts: Deployment,
) -> None:
    d = module_hosts
    # Clients that give up a peer that stopped answering within seconds, as
    # the Python client does with its pings.
    options: dict[str, Any] = {"ping_interval": 1, "ping_timeout": 2, "timeout": 5}
    # Worker gw1 on gw1 directly; it stops acking just before the cut, so the
    # leases it holds then are never acked: the cut gateway cannot be told
    # that its socket is gone, and they must come back through their
    # visibility timeout to the others, through haproxy.
    workers: dict[str, str | None] = {"gw1": ws_of(d, 0), "a": None, "b": None}
    t = Traffic.start(d, unique("cutclients"), workers=workers, frozen=("gw1",), **options)
    states: list[tuple[float, str]] = []

    async def watch_balancer(stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                state = (await asyncio.to_thread(d.balancer.states)).get("gw1", "?")
                if not states or states[-1][1] != state:
                    states.append((time.time(), state))
            await asyncio.sleep(0.1)

    stop_watching = asyncio.Event()
    watching = asyncio.create_task(watch_balancer(stop_watching))
    try:
        await t.confirmed(150)
        t.freeze.set()
        await wait_until(lambda: t.unacked("gw1"), "worker gw1 holding a lease")
        with partitioned([d.gateways[0].host], [d.client, d.balancer.host]) as cut:
            assert cut.cut_at is not None
            moment = cut.cut_at
            at_cut = len(t.ledger.confirmed)
            held = t.unacked("gw1")

            def moved_on() -> bool:
                down = any(s.startswith("DOWN") and at > moment for at, s in states)
                return down and len(t.ledger.confirmed) >= at_cut + 100

            await hold(cut, moved_on)
        assert cut.healed_at is not None
        healed = cut.healed_at
        await wait_until(
            lambda: any(s == "UP" and at > healed for at, s in states), "haproxy sees gw1 UP"
        )
        back = await confirms_directly(d, 0, unique("cutclients-direct"))
        await t.confirmed(len(t.ledger.confirmed) + 100)
        counts = await t.finish()
    finally:
        stop_watching.set()
        await watching
        await t.stop()

    down = min((at for at, s in states if s.startswith("DOWN") and at > moment), default=None)
    # When each lease held by gw1's worker was first delivered to another worker.
    elsewhere: dict[tuple[str, int], float] = {}
    counts_then: dict[tuple[str, int], int] = {}
    for who, mid, count, at in t.ledger.deliveries:
        for lease in held:
            if who != "gw1" and mid == lease[0] and count > lease[1] and lease not in elsewhere:
                elsewhere[lease] = at
                counts_then[lease] = count
    redelivered = max(elsewhere.values(), default=None)
    up = min((at for at, s in states if s == "UP" and at > healed), default=None)
    # The longest any producer waited for a confirmation across the cut.
    stalls: list[str] = []
    for name in ("p0", "p1"):
        times = sorted(v for k, v in t.ledger.confirmed.items() if k.startswith(f"{name}-"))
        gaps = [b - a for a, b in itertools.pairwise(times) if b > moment]
        stalls.append(f"{max(gaps):.2f} s" if gaps else "none confirmed after the cut")
    print(
        f"\nPARTITION gw1|clients: cut {healed - moment:.1f} s; haproxy saw gw1 DOWN "
        f"{since(down, moment)} after the cut and UP {since(up, healed)} after the heal; "
        f"longest wait of each producer for a confirmation {stalls}; "
        f"gw1 asked "
        f"directly confirmed {back:.2f} s after haproxy saw it UP; the {len(held)} leases held "
        f"by gw1's worker at the cut were all delivered elsewhere by {since(redelivered, moment)}"
        f" after it, with deliveries {sorted(counts_then.values())}; "
        f"{t.summary()}"
    )
    t.check(counts)
    assert down is not None, states
    # What the cut gateway's worker held was delivered again, to another worker
    # (with a higher count: the cut gateway may have leased it again to its
    # dead socket in between, while that socket had credit).
    assert held and set(held) == set(elsewhere), (held, elsewhere)
    no_traceback(d)
    # ... and during the cut, not after the heal: a lease that ran out on the
    # silent socket pauses it (consumers.worker.QUIET_HOLD), so the message
    # goes to a worker on the other gateway instead of back to the dead socket.
    late = {lease: at - healed for lease, at in elsewhere.items() if at > healed}
    assert not late, f"delivered elsewhere only after the heal: {late}"


async def test_gateways_cut_from_each_other_carry_on(module_hosts: Deployment) -> None:
    """The gateways share nothing but the database and Redis: cutting them apart changes nothing."""
    d = module_hosts
    topic = unique("cutpeers")
    listener = await Session.open(d, 0, topic)
    publisher = Publisher(d, 1, topic)
    stop = asyncio.Event()
    t = Traffic.start(d, unique("cutpeersq"), workers={"gw1": ws_of(d, 0), "gw2": ws_of(d, 1)})
    publishing: asyncio.Task[None] | None = None
    try:
        publishing = asyncio.create_task(publisher.run(stop))
        await wait_until(lambda: listener.items, "gw2's publishes reaching gw1")
        await t.confirmed(100)
        with partitioned([d.gateways[0].host], [d.gateways[1].host]) as cut:
            assert cut.cut_at is not None
            moment = cut.cut_at
            at_cut = len(t.ledger.confirmed)
            published = len(publisher.confirmed)
            await hold(cut, lambda: len(publisher.confirmed) >= published + 20)
            # Published on gw2, delivered on gw1, during the cut.
            await wait_until(
                lambda: expected(listener, publisher.confirmed) <= set(listener.bodies),
                "gw2's publishes on gw1",
            )
            closed = listener.close_code
            during = len(t.ledger.confirmed) - at_cut
        stop.set()
        await publishing
        counts = await t.finish()
    finally:
        stop.set()
        if publishing is not None:
            await asyncio.gather(publishing, return_exceptions=True)
        await t.stop()
        await listener.close()
    print(
        f"\nPARTITION gw1|gw2: cut {time.time() - moment:.1f} s; {during} enqueues confirmed "
        f"during it; probes {[dict(p.outcomes_between(moment, time.time())) for p in t.probes]}; "
        f"{len(publisher.confirmed)} publishes on gw2 delivered on gw1; {t.summary()}"
    )
    t.check(counts)
    assert not t.ledger.answers["enqueue", "unavailable"], t.summary()
    assert all(set(p.outcomes_between(moment, time.time())) == {"enqueued"} for p in t.probes)
    assert listener.in_order() and not listener.holes() and closed is None
    no_traceback(d)
