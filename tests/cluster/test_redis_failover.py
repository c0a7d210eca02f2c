"""Redis failover through Sentinel, on separate hosts: topics never get a silent gap.

The deployment of tests/cluster/deploy.py with Sentinel: the Redis master
on host ``redis``, a replica of it on ``redis2``, a Sentinel on each of
those and on ``redis3``, and both gateways on
``REDIS_URL=redis+sentinel://SENTINELS/leasecast/0``, so they ask the
Sentinels where the master is (gateway.topics.redis_url).

Replication is asynchronous, so a promoted replica can lack the last
publishes the old master confirmed. The test makes sure it does: the
replica's link to the master is cut (``CLIENT KILL TYPE master``) and it
cannot log in again (a wrong ``masteruser``) while five more publishes are
confirmed by the master alone; then every process of the master's host is killed and the
replica let go. The Sentinels promote it. Its topic offsets are behind the
ones the gateways handed out, so carrying on in the same epoch would give
new messages offsets that subscribers already passed: a gap nobody is told
of. What must happen instead (docs/protocol.md, "A new epoch while
subscribed"):

- the subscribers open across the switch, on both gateways, are closed
  with 4409, and until then got every message in offset order, no hole;
- resubscribing with their ``since``/``epoch`` is answered
  ``recovered: false`` with a new epoch, and every publish confirmed after
  that reaches them, no hole;
- publishes in the switch are answered ``unavailable`` (the publisher sends
  them again), and both gateways publish again by themselves (no restart),
  through the new master; the channel layer follows it too (a dashboard
  shows both processes again).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from tests.cluster.deploy import Deployment
from tests.cluster.load import Session
from tests.cluster.services import GATEWAY_PORT, open_socket
from tests.support.clients import Socket, unique
from tests.support.waiting import wait_until

# Alone, after the parallel run: hosts, databases and Sentinels of their own.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

CLOSE_NEW_EPOCH = 4409


@dataclass
class Publisher:
    """Publishes 0, 1, 2... through haproxy; one not confirmed is sent again."""

    d: Deployment
    topic: str
    confirmed: dict[int, tuple[str, int]] = field(default_factory=dict)  # n -> (epoch, offset)
    refused: int = 0
    next: int = 0
    socket: Socket | None = None

    async def publish(self, deadline: float) -> tuple[str, int]:
        """Publish the next number, again until confirmed; its (epoch, offset)."""
        n = self.next
        while time.monotonic() < deadline:
            try:
                if self.socket is None:
                    self.socket = await open_socket(
                        self.d.client, f"{self.d.balancer.ws}/ws/produce/", self.d.token
                    )
                reply = await self.socket.request(
                    {"op": "publish", "topic": self.topic, "body": n}, timeout=15
                )
            except (OSError, ConnectionError, ConnectionClosed, TimeoutError):
                self.refused += 1
                self.socket = None
                await asyncio.sleep(0.1)
                continue
            if reply["op"] == "published":
                self.confirmed[n] = (reply["epoch"], reply["offset"])
                self.next += 1
                return self.confirmed[n]
            assert reply.get("code") in ("unavailable", "backpressure"), reply
            self.refused += 1
            await asyncio.sleep(0.1)
        raise AssertionError(f"publish {n} never confirmed ({self.refused} refused)")


def _link_down(d: Deployment) -> bool:
    assert d.replica is not None
    info = d.replica.command("INFO", "replication")
    return isinstance(info, dict) and info.get("master_link_status") == "down"


async def publish_directly(d: Deployment, gateway: int, topic: str, body: Any) -> dict[str, Any]:
    """One publish on one gateway (not through haproxy); retried while it is unavailable."""
    url = f"ws://{d.gateways[gateway].host.address}:{GATEWAY_PORT}/ws/produce/"
    deadline = time.monotonic() + 30
    async with await open_socket(d.client, url, d.token) as s:
        while True:
            reply = await s.request({"op": "publish", "topic": topic, "body": body})
            if reply["op"] == "published" or time.monotonic() > deadline:
                return reply
            await asyncio.sleep(0.1)


async def peer_heard_after(d: Deployment, moment: float, timeout: float = 30) -> bool:
    """Whether a dashboard on gw1 shows a snapshot of the other process taken after
    ``moment`` (wall clock), which only the channel layer can have brought."""
    url = f"ws://{d.gateways[0].host.address}:{GATEWAY_PORT}/ws/dashboard/"
    deadline = time.monotonic() + timeout
    async with await open_socket(d.client, url, d.token) as dash:
        while time.monotonic() < deadline:
            frame = await dash.next(timeout=5)
            if frame["op"] != "snapshot":
                continue  # the history frame, once
            here, *peers = frame["processes"]
            if any(p["name"] != here["name"] and p["time"] > moment for p in peers):
                return True
    return False


async def test_redis_master_replaced_through_sentinel_gives_a_new_epoch_never_a_gap(
    sentinel: Deployment,
) -> None:
    d = sentinel
    assert d.replica is not None and d.replica.proc is not None
    topic = unique("sentinel")
    old = [await Session.open(d, i, topic) for i in (0, 1)]
    new: list[Session] = []
    publisher = Publisher(d, topic)
    try:
        await asyncio.sleep(0.5)  # both gateways follow the topic
        deadline = time.monotonic() + 60
        for _ in range(20):
            await publisher.publish(deadline)
        await wait_until(
            lambda: all(len(s.items) >= 20 for s in old), "the first 20 delivered", timeout=20
        )
        old_epoch = publisher.confirmed[0][0]

        # The replica falls behind: it logs in to the master as a user that
        # does not exist, so once its link is cut it cannot sync again, and
        # these publishes are confirmed by the master alone.
        d.replica.command("CONFIG", "SET", "masteruser", "nobody-here", "masterauth", "wrong")
        d.replica.command("CLIENT", "KILL", "TYPE", "master")
        await wait_until(lambda: _link_down(d), "the replica's link to the master cut", timeout=10)
        for _ in range(5):
            await publisher.publish(deadline)
        # The master's host dies (its Sentinel with it).
        await asyncio.to_thread(d.redis.host.kill_all)
        killed = time.monotonic()
        before_switch = publisher.next

        # Publishing goes on through the switch; the open subscribers are told.
        first_after: float | None = None
        while not all(s.close_code is not None for s in old):
            await publisher.publish(deadline)
            first_after = first_after or time.monotonic()
            if time.monotonic() > killed + 20:
                break
        told = time.monotonic()
        summary = (
            f"old sessions got {[len(s.items) for s in old]} messages, closed "
            f"{[s.close_code for s in old]}; {publisher.next} publishes confirmed "
            f"({before_switch} before the switch), {publisher.refused} refused; "
            f"epochs confirmed {sorted({e for e, _ in publisher.confirmed.values()})}; "
            f"(offset, body) around the switch: "
            f"{[[i for i in s.items if abs(i[1] - before_switch) < 8] for s in old]}"
        )
        # The switch reached the publisher as errors it can retry, not as a hang.
        assert publisher.refused > 0, summary
        for s in old:
            assert s.close_code == CLOSE_NEW_EPOCH, f"{summary}\n{d.logs()}"
            assert s.in_order() and not s.holes() and s.dropped == 0, (s.items, summary)
            assert not s.missing(), (s.missing(), summary)

        # Resubscribing from where they were: told they were not recovered.
        new = [
            await Session.open(d, s.gateway, topic, resume=(s.items[-1][0], old_epoch)) for s in old
        ]
        await wait_until(lambda: all(s.subscribed for s in new), "subscribed frames", timeout=20)
        for s in new:
            assert s.subscribed is not None
            assert s.subscribed["recovered"] is False, s.subscribed
            assert s.subscribed["epoch"] != old_epoch, s.subscribed
        first_new = publisher.next
        for _ in range(10):
            await publisher.publish(deadline)
        # Both gateways publish by themselves through the new master.
        direct = [await publish_directly(d, i, topic, f"direct-{i}") for i in (0, 1)]
        assert all(reply["op"] == "published" for reply in direct), direct
        wanted = [*range(first_new, publisher.next), "direct-0", "direct-1"]
        await wait_until(
            lambda: all(set(wanted) <= set(s.bodies) for s in new),
            "the new epoch delivered",
            timeout=20,
        )
        new_epoch = new[0].subscribed["epoch"] if new[0].subscribed else None
        # The channel layer follows the master too: a dashboard on gw1 hears
        # from gw2 again.
        assert await peer_heard_after(d, time.time()), "no snapshot of gw2 after the switch"
        for s in new:
            assert s.in_order() and not s.holes() and s.dropped == 0, s.items
            assert not s.missing(), s.missing()
        # Everything confirmed since the resubscription is of the new epoch.
        assert {publisher.confirmed[n][0] for n in range(first_new, publisher.next)} == {new_epoch}
        print(
            f"\nRedis failover through Sentinel: {summary}; after the master's host was killed, "
            f"the first publish was confirmed at {(first_after or told) - killed:.2f} s and the "
            f"subscribers were told (4409) by {told - killed:.2f} s; new epoch {new_epoch}"
        )
    finally:
        if publisher.socket is not None:
            await publisher.socket.close()
        for s in [*old, *new]:
            await s.close()
