"""Server-sent events against subscriber WebSockets: deliveries/s, same gateway, same run.

    python -m bench.sse                 # 10 and 100 subscribers, daphne and uvicorn, 2 rounds
    python -m bench.sse --quick         # 10 subscribers, one small round
    python -m bench.sse --json bench/results/sse.json

One gateway process per server (SQLite, no Redis). For each subscriber count
N and each arm, N readers of a fresh topic, then one producer socket
pipelines ``--messages`` publishes (100 unconfirmed at most), bodies stamped
with the send time:

- **ws**: N subscriber sockets ``/ws/topics/T/`` (credit and capacity large
  enough that nothing is dropped);
- **sse**: N event streams ``GET /sse/topics/T/`` (the same capacity), read
  by the raw HTTP client of the tests (tests/support/events.py).

Deliveries/s counts messages received by all readers together, from the
first publish to the last receipt (every reader must get every message, in
order); latency is publish-to-receipt; the gateway's CPU time per delivery
(``/proc``, user + system, over the same span) is the figure a loaded
machine moves least. The readers share the machine (and
one Python process) with the gateway, so the client's parsing is in the
figure on both arms. Arms alternate in order round by round; compare them
within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect

from bench.workqueue import percentile
from tests.support.databases import sqlite_database
from tests.support.events import open_stream
from tests.support.gateways import GatewayProcess


@dataclass
class Row:
    """One arm of one round."""

    server: str
    transport: str
    subscribers: int
    messages: int
    delivered: int
    deliveries_per_s: float
    p50_ms: float
    p99_ms: float
    #: the gateway process's CPU time (user + system) per delivery, microseconds
    gateway_cpu_us: float


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _round(
    gateway: GatewayProcess, token: str, transport: str, n_subs: int, n_msgs: int
) -> Row:
    topic = f"sse{uuid.uuid4().hex[:10]}"
    headers = {"Authorization": f"Bearer {token}"}
    latencies: list[float] = []
    counts = [0] * n_subs
    last_receipt = 0.0
    done = asyncio.Event()
    remaining = n_subs

    def received(k: int, bodies: list[dict[str, Any]], now: float) -> bool:
        nonlocal last_receipt, remaining
        for body in bodies:
            assert body["i"] == counts[k], (transport, k, body["i"], counts[k])
            counts[k] += 1
            latencies.append(now - body["t"])
        last_receipt = now
        if counts[k] >= n_msgs:
            remaining -= 1
            if remaining == 0:
                done.set()
            return True
        return False

    opened = asyncio.Event()
    ready = 0

    def one_open() -> None:
        nonlocal ready
        ready += 1
        if ready == n_subs:
            opened.set()

    async def ws_reader(k: int) -> None:
        url = f"{gateway.ws}/ws/topics/{topic}/?capacity={n_msgs}&credit=1000000000"
        async with connect(url, additional_headers=headers, max_size=None) as ws:
            one_open()
            async for text in ws:
                frame = orjson.loads(text)
                bodies = [item["body"] for item in frame["items"]]
                if received(k, bodies, time.time()):
                    return

    async def sse_reader(k: int) -> None:
        stream = await open_stream(f"{gateway.http}/sse/topics/{topic}/?capacity={n_msgs}", token)
        assert stream.status == 200
        one_open()
        try:
            while True:
                event = await stream.next(timeout=120)
                assert event is not None and event.event == "message"
                if received(k, [orjson.loads(event.data)], time.time()):
                    return
        finally:
            await stream.close()

    reader = ws_reader if transport == "ws" else sse_reader
    tasks = [asyncio.create_task(reader(k)) for k in range(n_subs)]
    await asyncio.wait_for(opened.wait(), 120)
    await asyncio.sleep(0.3)  # every subscription attached
    window = asyncio.Semaphore(100)
    assert gateway.proc is not None
    cpu_before = _cpu_seconds(gateway.proc.pid)
    async with connect(f"{gateway.ws}/ws/produce/", additional_headers=headers) as pub:

        async def replies() -> None:
            for _ in range(n_msgs):
                await pub.recv()
                window.release()

        replying = asyncio.create_task(replies())
        start = time.time()
        for i in range(n_msgs):
            await window.acquire()
            frame = {"op": "publish", "topic": topic, "body": {"t": time.time(), "i": i}}
            await pub.send(orjson.dumps(frame).decode())
        await replying
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 120)
    cpu = _cpu_seconds(gateway.proc.pid) - cpu_before
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    delivered = sum(counts)
    elapsed = max(last_receipt - start, 1e-9)
    return Row(
        gateway.server,
        transport,
        n_subs,
        n_msgs,
        delivered,
        delivered / elapsed,
        percentile(latencies, 0.5) * 1000,
        percentile(latencies, 0.99) * 1000,
        cpu / max(delivered, 1) * 1e6,
    )


async def _measure(server: str, counts: list[int], total: int, rounds: int) -> list[Row]:
    rows: list[Row] = []
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-bench-sse-{server}-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name=f"sse-{server}", server=server)
        gateway.start()
        try:
            token = gateway.issue_token("admin", name="bench")
            for n_subs in counts:
                n_msgs = max(100, total // n_subs)
                for r in range(rounds):
                    arms = ["ws", "sse"] if r % 2 == 0 else ["sse", "ws"]
                    for transport in arms:
                        row = await _round(gateway, token, transport, n_subs, n_msgs)
                        print(json.dumps(asdict(row)), flush=True)
                        rows.append(row)
        finally:
            gateway.stop()
    return rows


def _summary(rows: list[Row]) -> list[dict[str, Any]]:
    """Per server, transport and subscriber count: the median of the rounds."""
    keys = sorted({(r.server, r.subscribers, r.transport) for r in rows})
    out = []
    for server, subs, transport in keys:
        group = [
            r for r in rows if (r.server, r.subscribers, r.transport) == (server, subs, transport)
        ]
        out.append(
            {
                "server": server,
                "transport": transport,
                "subscribers": subs,
                "messages": group[0].messages,
                "delivered_all": all(r.delivered == r.messages * subs for r in group),
                "deliveries_per_s": statistics.median(r.deliveries_per_s for r in group),
                "p50_ms": statistics.median(r.p50_ms for r in group),
                "p99_ms": statistics.median(r.p99_ms for r in group),
                "gateway_cpu_us": statistics.median(r.gateway_cpu_us for r in group),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 subscribers, one small round")
    parser.add_argument("--json", type=Path, help="write the rows and the summary here")
    parser.add_argument("--messages", type=int, default=100_000, help="deliveries per round")
    parser.add_argument("--servers", default="daphne,uvicorn")
    args = parser.parse_args()
    counts = [10] if args.quick else [10, 100]
    total = 10_000 if args.quick else args.messages
    rounds = 1 if args.quick else 2
    rows: list[Row] = []
    for server in args.servers.split(","):
        rows += asyncio.run(_measure(server, counts, total, rounds))
    summary = _summary(rows)
    print(
        "| server | transport | subscribers | messages each | deliveries/s "
        "| gateway CPU us/delivery | p50 ms | p99 ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for s in summary:
        print(
            f"| {s['server']} | {s['transport']} | {s['subscribers']} | {s['messages']:,} "
            f"| {s['deliveries_per_s']:,.0f} | {s['gateway_cpu_us']:.1f} "
            f"| {s['p50_ms']:.1f} | {s['p99_ms']:.1f} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"rows": [asdict(r) for r in rows], "summary": summary}
        args.json.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
