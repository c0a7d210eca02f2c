"""A worker socket that let a lease run out without a word is not handed the message straight back.

A client cut off from its gateway keeps a live-looking socket there until
the pings give it up; each lease that runs out on it frees room, and the
pump used to fill that room at once with the oldest visible message, the
one that had just expired, so it bounced on the dead socket (its
``deliveries`` rising) instead of reaching a worker elsewhere
(tests/cluster/test_partitions.py found it across hosts). A socket whose
client has said nothing since before such a lease began now gets no new
lease for ``consumers.worker.QUIET_HOLD`` seconds, or until the client is
heard from; so does every other socket of the queue on that process whose
client has been silent as long (one cut off with it, that had acked all it
held and so has room). A worker alone on its queue still gets the message
again.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from consumers.worker import QUIET_HOLD
from tests.integration.test_workqueue import enqueue, producer, worker
from tests.support.clients import Socket, unique
from tests.support.gateways import GatewayProcess

TIMEOUT = 1.0  # the lease's visibility timeout in these tests
ROUNDS = 2


async def test_an_expired_lease_of_a_silent_socket_goes_to_another_worker(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """On one process the other socket gets it in any case (the pump finds the
    message due before the silent socket's room reopens); across processes
    the pause is what lets another gateway's worker win (test_partitions)."""
    p = await producer(gateway, admin_token)
    try:
        for _ in range(ROUNDS):
            q = unique("quiet")
            silent = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=TIMEOUT)
            sent = await enqueue(p, q, "job")
            (first,) = await silent.deliveries(1)
            assert (first["id"], first["deliveries"]) == (sent["id"], 1)
            # The other opens halfway through the lease, so it has not been
            # silent for QUIET_HOLD when the lease runs out (else it is paused too).
            await asyncio.sleep(TIMEOUT / 2)
            other = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=TIMEOUT)
            (again,) = await other.deliveries(1, timeout=TIMEOUT + 10)
            assert (again["id"], again["deliveries"]) == (sent["id"], 2)
            reply = await other.request({"op": "ack", "receipt": again["receipt"]})
            assert reply["op"] == "acked", reply
            await silent.quiet(QUIET_HOLD + 0.5)  # and nothing more for the silent socket
            await silent.close()
            await other.close()
    finally:
        await p.close()


async def test_a_silent_worker_alone_on_its_queue_still_gets_the_message_again(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("quiet-alone")
    p = await producer(gateway, admin_token)
    w = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=TIMEOUT)
    try:
        sent = await enqueue(p, q, "job")
        (first,) = await w.deliveries(1)
        started = time.monotonic()
        (again,) = await w.deliveries(1, timeout=TIMEOUT + QUIET_HOLD + 10)
        waited = time.monotonic() - started
        assert (again["id"], again["deliveries"]) == (sent["id"], 2)
        # Not straight back when its lease ran out: the pause came first (the
        # slack is for the first delivery's own trip, which load can delay).
        assert waited >= TIMEOUT + QUIET_HOLD - 0.5, waited
        reply = await w.request({"op": "ack", "receipt": again["receipt"]})
        assert reply["op"] == "acked", reply
        assert first["receipt"] != again["receipt"]
    finally:
        await w.close()
        await p.close()


async def test_a_worker_that_speaks_takes_work_again_at_once(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """The pause ends as soon as the client sends a frame (here a stale ack)."""
    q = unique("quiet-speaks")
    p = await producer(gateway, admin_token)
    w = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=TIMEOUT)
    try:
        await enqueue(p, q, "first")
        (first,) = await w.deliveries(1)
        await asyncio.sleep(TIMEOUT + 0.2)  # its lease runs out; the socket is paused
        reply = await w.request({"op": "ack", "receipt": first["receipt"]})
        assert reply.get("code") == "stale_receipt", reply
        (again,) = await w.deliveries(1, timeout=QUIET_HOLD + 5)
        assert (again["body"], again["deliveries"]) == ("first", 2)
        await w.request({"op": "ack", "receipt": again["receipt"]})
    finally:
        await w.close()
        await p.close()


async def test_an_idle_silent_socket_is_paused_too_when_a_lease_runs_out_beside_it(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """A socket that has room and has said nothing for QUIET_HOLD is not handed
    the expired message at once either: across hosts it is as likely to be cut
    off as the one whose lease ran out (test_partitions found it so)."""
    q = unique("quiet-idle")
    lease = 2.5  # so that the idle socket has been silent for QUIET_HOLD by its end
    p = await producer(gateway, admin_token)
    frozen = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=lease)
    idle: Socket | None = None
    try:
        sent = await enqueue(p, q, "job")
        (first,) = await frozen.deliveries(1)
        assert (first["id"], first["deliveries"]) == (sent["id"], 1)
        started = time.monotonic()
        idle = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=lease)
        again = await first_delivery(frozen, idle, timeout=lease + QUIET_HOLD + 10)
        waited = time.monotonic() - started
        assert (again["id"], again["deliveries"]) == (sent["id"], 2)
        # Without the pause the idle socket takes it the moment the lease ends.
        assert waited >= lease + QUIET_HOLD - 0.5, waited
    finally:
        for s in (frozen, idle, p):
            if s is not None:
                await s.close()


async def first_delivery(*sockets: Socket, timeout: float) -> dict[str, Any]:
    """The first ``deliver`` frame any of ``sockets`` receives."""
    waits = [asyncio.ensure_future(s.next(timeout)) for s in sockets]
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for w in pending:
        w.cancel()
    frame = next(iter(done)).result()
    assert frame["op"] == "deliver", frame
    return frame
