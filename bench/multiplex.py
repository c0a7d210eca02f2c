"""One socket carrying N subscriptions (``/ws/``) against N subscriber sockets.

    python -m bench.multiplex                  # N = 10, 100, 1000; 2 rounds; ~3 minutes
    python -m bench.multiplex --quick          # N = 10, 100; one small round
    python -m bench.multiplex --json bench/results/multiplex.json

One gateway process (daphne, SQLite, no Redis). For each N, each arm:

- **sockets**: N subscriber sockets ``/ws/topics/T_i/``, one topic each;
- **multiplex**: one socket ``/ws/`` subscribed to the same N topics.

Memory: the gateway's RSS (``VmRSS``) after the N subscriptions are open,
less before, over N: KiB per subscription (the sockets' transport and
consumer included for the first arm). Deliveries/s: one producer socket
pipelines ``--messages`` publishes (100 unconfirmed), spread round-robin over
the N topics; the clock runs from the first publish to the last message
received by the subscribers (every message checked: each topic's items in
order, none missing). Subscribers grant credit in halves of a 256 window.

Arms alternate in order round by round (A,B then B,A); the machine is shared,
so compare the arms within a run, not figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.fanout import rss_kib
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess

WINDOW = 256


async def _open_sockets(base: str, token: str, topics: list[str]) -> list[ClientConnection]:
    headers = {"Authorization": f"Bearer {token}"}
    sockets: list[ClientConnection] = []
    for start in range(0, len(topics), 50):  # 50 handshakes at a time
        sockets += await asyncio.gather(
            *(
                connect(f"{base}/ws/topics/{t}/?credit={WINDOW}", additional_headers=headers)
                for t in topics[start : start + 50]
            )
        )
    return sockets


async def _open_multiplexed(base: str, token: str, topics: list[str]) -> ClientConnection:
    ws = await connect(f"{base}/ws/", additional_headers={"Authorization": f"Bearer {token}"})
    for i, topic in enumerate(topics):
        await ws.send(
            orjson.dumps({"op": "subscribe", "topic": topic, "credit": WINDOW, "ref": i}).decode()
        )
    for _ in topics:
        reply = orjson.loads(await ws.recv())
        assert reply["op"] == "subscribed", reply
    return ws


async def _read(
    ws: ClientConnection,
    got: dict[str, list[int]],
    wanted: int,
    done: asyncio.Event,
    multiplexed: bool,
) -> None:
    """Read ``messages`` frames, grant credit back per topic, until ``wanted`` arrived in all."""
    consumed: dict[str, int] = {}
    while not done.is_set():
        frame = orjson.loads(await ws.recv())
        if frame["op"] != "messages":
            continue
        topic = frame["topic"]
        items = [item["body"] for item in frame["items"]]
        got[topic] += items
        n = consumed.get(topic, 0) + len(items)
        if n >= WINDOW // 2:
            credit: dict[str, Any] = {"op": "credit", "n": n}
            if multiplexed:
                credit["topic"] = topic
            await ws.send(orjson.dumps(credit).decode())
            n = 0
        consumed[topic] = n
        if sum(map(len, got.values())) >= wanted:
            done.set()


async def _publish(base: str, token: str, topics: list[str], messages: int) -> None:
    window = asyncio.Semaphore(100)
    async with connect(
        f"{base}/ws/produce/", additional_headers={"Authorization": f"Bearer {token}"}
    ) as pub:

        async def replies() -> None:
            for _ in range(messages):
                reply = orjson.loads(await pub.recv())
                assert reply["op"] == "published", reply
                window.release()

        reader = asyncio.create_task(replies())
        for i in range(messages):
            await window.acquire()
            topic = topics[i % len(topics)]
            await pub.send(f'{{"op":"publish","topic":"{topic}","body":{i}}}')
        await reader


async def one_arm(
    gw: GatewayProcess, token: str, arm: str, n: int, messages: int
) -> dict[str, Any]:
    assert gw.proc is not None
    topics = [f"mx{uuid.uuid4().hex[:8]}" for _ in range(n)]
    await asyncio.sleep(0.5)
    before = rss_kib(gw.proc.pid)
    if arm == "sockets":
        sockets = await _open_sockets(gw.ws, token, topics)
    else:
        sockets = [await _open_multiplexed(gw.ws, token, topics)]
    await asyncio.sleep(1.0)
    after = rss_kib(gw.proc.pid)
    got: dict[str, list[int]] = {t: [] for t in topics}
    done = asyncio.Event()
    readers = [
        asyncio.create_task(_read(ws, got, messages, done, arm == "multiplex")) for ws in sockets
    ]
    started = time.perf_counter()
    await _publish(gw.ws, token, topics, messages)
    await asyncio.wait_for(done.wait(), 300)
    seconds = time.perf_counter() - started
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for ws in sockets:
        await ws.close()
    for k, topic in enumerate(topics):
        assert got[topic] == list(range(k, messages, n)), f"{arm} N={n}: {topic} incomplete"
    return {
        "arm": arm,
        "n": n,
        "kib_per_subscription": (after - before) / n,
        "deliveries_per_s": messages / seconds,
        "seconds": seconds,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-bench-mux-"))
    rows: list[dict[str, Any]] = []
    with sqlite_database(var) as env:
        env["GATEWAY_MAX_SUBSCRIPTIONS"] = str(max(args.n) + 1)
        token = GatewayProcess(env, var).issue_token("admin", name="bench")
        for rnd in range(args.rounds):
            for n in args.n:
                arms = ["sockets", "multiplex"]
                for arm in arms if rnd % 2 == 0 else arms[::-1]:
                    # A fresh process per arm: RSS growth is then what the
                    # subscriptions cost, not memory an earlier arm freed.
                    gw = GatewayProcess(env, var, name=f"mux-{arm}-{n}")
                    gw.start()
                    try:
                        await warm_up(gw, token)
                        row = await one_arm(gw, token, arm, n, args.messages)
                    finally:
                        gw.stop()
                    row["round"] = rnd
                    rows.append(row)
                    print(
                        f"round {rnd} N={n:>5} {arm:>9}: "
                        f"{row['kib_per_subscription']:8.1f} KiB/subscription, "
                        f"{row['deliveries_per_s']:9,.0f} deliveries/s"
                    )
    return {"rows": rows, "messages": args.messages}


async def warm_up(gw: GatewayProcess, token: str) -> None:
    """Both kinds of subscription once, and some publishes: code paths loaded first."""
    topic = f"warm{uuid.uuid4().hex[:8]}"
    sockets = await _open_sockets(gw.ws, token, [topic])
    sockets.append(await _open_multiplexed(gw.ws, token, [topic]))
    await _publish(gw.ws, token, [topic], 200)
    for ws in sockets:
        await ws.close()


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| N | arm | KiB per subscription (median) | deliveries/s (median) |",
        "|---|---|---|---|",
    ]
    keys = sorted({(r["n"], r["arm"]) for r in rows})
    for n, arm in keys:
        mine = [r for r in rows if (r["n"], r["arm"]) == (n, arm)]
        kib = statistics.median(r["kib_per_subscription"] for r in mine)
        rate = statistics.median(r["deliveries_per_s"] for r in mine)
        lines.append(f"| {n:,} | {arm} | {kib:.1f} | {rate:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.multiplex", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--n", default="10,100,1000", help="subscriptions per arm")
    parser.add_argument("--messages", type=int, default=20_000, help="publishes per arm")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.n = [int(x) for x in args.n.split(",")]
    if args.quick:
        args.n, args.messages, args.rounds = [10, 100], 2_000, 1
    data = asyncio.run(run(args))
    print()
    print(summary(data["rows"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
