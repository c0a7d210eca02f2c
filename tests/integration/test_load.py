"""1,000 concurrent sockets on one gateway process (issue 6, item 4).

500 workers on 10 queues and 500 subscribers on 10 topics, all open at once
on one daphne process. Every enqueued message must be leased exactly once (no
redelivery: the leases outlive the test) and acked; every subscriber must get
every message published to its topic, in order, nothing dropped. Then every
socket closes and the gateway's ``/api/stats`` must come back to 0 sockets.

Open files: the test process needs a descriptor per socket, and so does the
gateway. The test raises its own soft ``RLIMIT_NOFILE`` (up to the hard
limit) before it starts the gateway, which inherits it; the gateway's limit
is read back from ``/proc/PID/limits``. If the hard limit is too low the test
is skipped and says so. It runs on SQLite and on PostgreSQL (when it answers).
"""

from __future__ import annotations

import asyncio
import resource
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until

#: Alone, after the parallel run: a thousand sockets want the machine to themselves.
pytestmark = [pytest.mark.slow, pytest.mark.serial]

WORKERS = 500
SUBSCRIBERS = 500
QUEUES = 10
TOPICS = 10
PER_QUEUE = 500  # messages enqueued to each queue
PER_TOPIC = 100  # messages published to each topic
SOCKETS = WORKERS + SUBSCRIBERS
#: Descriptors beyond the sockets: the interpreter, the database, the logs, pipes.
SPARE_FILES = 200


def open_files_limit(pid: int) -> int:
    """The soft ``Max open files`` of a running process."""
    with open(f"/proc/{pid}/limits") as limits:
        for line in limits:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


@pytest.fixture
def roomy_gateway(database_env: tuple[dict[str, str], Path]) -> Iterator[GatewayProcess]:
    """A gateway process allowed enough open files for every socket of the test."""
    needed = SOCKETS + SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit is {hard}; {SOCKETS} sockets need {needed}")
    raised = needed if hard == resource.RLIM_INFINITY else min(hard, max(soft, 4 * needed))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, raised), hard))
    env, var = database_env
    process = GatewayProcess(env, var, name="load")
    try:
        process.start()  # inherits the raised limit
        assert process.proc is not None
        limit = open_files_limit(process.proc.pid)
        assert limit >= needed, f"the gateway may open {limit} files; it needs {needed}"
        yield process
    finally:
        process.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def gather_in_batches(coros: list[Any], size: int = 100) -> list[Any]:
    """Run ``coros`` ``size`` at a time (connecting 1,000 at once only measures the backlog)."""
    results: list[Any] = []
    for start in range(0, len(coros), size):
        results += await asyncio.gather(*coros[start : start + size])
    return results


async def socket_count(gateway: GatewayProcess, token: str) -> int:
    status, stats = await ahttp("GET", f"{gateway.http}/api/stats", token)
    assert status == 200, stats
    return len(stats["sockets"])


async def test_a_thousand_sockets_on_one_process(roomy_gateway: GatewayProcess) -> None:
    gateway = roomy_gateway
    token = gateway.issue_token("admin", name="admin")
    ws = gateway.ws
    queues = [unique("loadq") for _ in range(QUEUES)]
    topics = [unique("loadt") for _ in range(TOPICS)]

    # -- all connect
    worker_urls = [
        f"{ws}/ws/queues/{queues[i % QUEUES]}/?prefetch=5&visibility_timeout=3600"
        for i in range(WORKERS)
    ]
    subscriber_urls = [f"{ws}/ws/topics/{topics[i % TOPICS]}/" for i in range(SUBSCRIBERS)]
    workers: list[Socket] = await gather_in_batches([Socket.open(u, token) for u in worker_urls])
    subscribers: list[Socket] = await gather_in_batches(
        [Socket.open(u, token) for u in subscriber_urls]
    )
    assert await socket_count(gateway, token) == SOCKETS

    # -- workers: every message leased once and acked
    deliveries: Counter[str] = Counter()
    acked: Counter[str] = Counter()
    expected = QUEUES * PER_QUEUE

    async def work(socket: Socket, queue: str) -> None:
        while True:
            frame = await socket.next(timeout=3600)
            assert frame["op"] == "deliver" and frame["queue"] == queue, frame
            assert frame["deliveries"] == 1, frame
            deliveries[frame["id"]] += 1
            reply = await socket.request({"op": "ack", "receipt": frame["receipt"]}, 60)
            assert reply["op"] == "acked", reply
            acked[frame["id"]] += 1

    # -- subscribers: every publish of their topic, in order
    heard: list[list[Any]] = [[] for _ in range(SUBSCRIBERS)]

    async def listen(k: int, socket: Socket) -> None:
        while True:
            frame = await socket.next(timeout=3600)
            assert frame["op"] == "messages" and frame["dropped"] == 0, frame
            heard[k] += [(item["seq"], item["body"]) for item in frame["items"]]

    tasks = [asyncio.create_task(work(s, queues[i % QUEUES])) for i, s in enumerate(workers)]
    tasks += [asyncio.create_task(listen(k, s)) for k, s in enumerate(subscribers)]

    ids: list[str] = []
    for q in queues:
        messages = [{"body": {"queue": q, "n": n}} for n in range(PER_QUEUE)]
        status, reply = await ahttp(
            "POST", f"{gateway.http}/api/queues/{q}/messages", token, {"messages": messages}
        )
        assert status == 200, reply
        ids += [r["id"] for r in reply["results"]]
    for t in topics:
        messages = [{"body": {"topic": t, "n": n}} for n in range(PER_TOPIC)]
        status, reply = await ahttp(
            "POST", f"{gateway.http}/api/topics/{t}/messages", token, {"messages": messages}
        )
        assert (status, reply) == (200, {"published": PER_TOPIC})

    async def all_done() -> bool:
        for task in tasks:
            if task.done():
                task.result()  # a failed check in a client: raise it here
        return sum(acked.values()) >= expected and all(len(h) >= PER_TOPIC for h in heard)

    await wait_until(all_done, "every message to be acked and every publish heard", timeout=120)
    assert sorted(acked) == sorted(ids) and set(acked.values()) == {1}
    assert set(deliveries.values()) == {1}
    for k, got in enumerate(heard):
        topic = topics[k % TOPICS]
        assert got == [(n + 1, {"topic": topic, "n": n}) for n in range(PER_TOPIC)], (k, got)
    assert await socket_count(gateway, token) == SOCKETS

    # -- all close
    for task in tasks:
        task.cancel()
    await gather_in_batches([s.close() for s in workers + subscribers])

    async def no_sockets() -> bool:
        return await socket_count(gateway, token) == 0

    await wait_until(no_sockets, "/api/stats to show 0 sockets", timeout=120)
    for q in queues:
        status, counts = await ahttp("GET", f"{gateway.http}/api/queues/{q}", token)
        assert status == 200, counts
        assert [counts[k] for k in ("visible", "delayed", "in_flight", "dead")] == [0, 0, 0, 0]
    assert gateway.proc is not None and gateway.proc.poll() is None
    assert "Traceback" not in gateway.log_text()
