"""The gateway beyond one machine: hosts of their own, as a deployment has them.

Each test starts its hosts (network namespaces on a bridge of their own,
tests/cluster/netns.py) and servers (tests/cluster/deploy.py): a client host,
haproxy on a balancer host, two gateway hosts, PostgreSQL on a database host
(and a synchronous standby on another), Redis on a host of its own. Every
client connection is made from the client host to haproxy; the gateways
reach the database and Redis over the bridge. Everything is removed
afterwards, whatever the test did.

Skipped, with the reason, without root, ``ip``, the machine's PostgreSQL
binaries, redis-server or haproxy.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.cluster.deploy import Deployment
from tests.cluster.services import open_socket, request
from tests.support.clients import Socket, unique

# Alone, after the parallel run: hosts, databases and Sentinels of their own.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


async def sockets_on(d: Deployment, gateway_index: int) -> int:
    """Work-queue sockets open on one gateway (asked directly, from the client host)."""
    gw = d.gateways[gateway_index]
    status, stats = await request(d.client, "GET", f"{gw.http}/api/stats", d.token)
    assert status == 200, stats
    return len(stats["sockets"])


async def test_work_and_topics_flow_from_a_client_host_over_two_gateway_hosts(
    hosts: Deployment,
) -> None:
    d = hosts
    queue, topic = unique("hosts"), unique("hostst")
    lb = d.balancer.ws
    # Two workers through haproxy: leastconn puts one on each gateway host.
    workers = [
        await open_socket(d.client, f"{lb}/ws/queues/{queue}/?prefetch=5", d.token)
        for _ in range(2)
    ]
    subscribers: list[Socket] = []
    try:
        assert await sockets_on(d, 0) >= 1 and await sockets_on(d, 1) >= 1
        subscribers = [
            await open_socket(d.client, f"{lb}/ws/topics/{topic}/", d.token) for _ in range(2)
        ]
        got: list[int] = []

        async def drain(w: Socket) -> None:
            with contextlib.suppress(TimeoutError):
                while True:
                    frame = await w.next(timeout=2)
                    assert frame["op"] == "deliver", frame
                    reply = await w.request({"op": "ack", "receipt": frame["receipt"]})
                    assert reply["op"] == "acked", reply
                    got.append(frame["body"]["n"])

        async with await open_socket(d.client, f"{lb}/ws/produce/", d.token) as producer:
            for n in range(40):
                sent = {"op": "enqueue", "queue": queue, "body": {"n": n}, "key": f"k{n}"}
                reply = await producer.request(sent)
                assert reply["op"] == "enqueued", reply
            await asyncio.gather(*(drain(w) for w in workers))
            # Each message once, and acked.
            assert sorted(got) == list(range(40)), got
            reply = await producer.request({"op": "publish", "topic": topic, "body": "hello"})
            assert reply["op"] == "published", reply
        for s in subscribers:  # one on each gateway host: the publish crossed Redis's host
            frame = await s.next()
            assert [item["body"] for item in frame["items"]] == ["hello"], frame
        status, stats = await request(d.client, "GET", f"{d.balancer.http}/api/queues/{queue}",
                                      d.token)  # fmt: skip
        assert status == 200 and (stats["visible"], stats["in_flight"]) == (0, 0), stats
    finally:
        for s in [*workers, *subscribers]:
            await s.close()
    # The servers saw the gateways as the separate hosts they are.
    peers = {
        row[0]
        for row in d.primary.query(
            "SELECT host(client_addr) FROM pg_stat_activity WHERE datname = %s AND client_addr "
            "IS NOT NULL",
            ("leasecast",),
        )
    }
    assert {gw.host.address for gw in d.gateways} <= peers, peers
    clients = d.redis.command("CLIENT", "LIST")
    text = clients.decode() if isinstance(clients, bytes) else str(clients)
    for gw in d.gateways:
        assert f"addr={gw.host.address}:" in text, text
