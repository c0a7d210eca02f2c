"""Fan-out benchmark: Leasecast (daphne, uvicorn) against two baselines, in one run.

    python -m bench.fanout            # 10, 100 and 1,000 subscribers; ~3 minutes
    python -m bench.fanout --quick    # smaller, under a minute

Baselines, both in ``bench/``: (a) the plain Channels way, a group per topic
and one ``group_send`` per publish on the in-memory layer, under daphne
(``bench/channels_baseline.py``); (b) a bare ``websockets`` server calling
``websockets.broadcast`` (``bench/websockets_baseline.py``).

The same load generator drives all four: N subscriber sockets, one publisher
pipelining publish frames (100 unconfirmed at most), bodies stamped with the
send time. Deliveries/s counts messages received by all subscribers together,
from the first publish to the last receipt; latency is publish-to-receipt.
Leasecast runs with policies on (``drop_oldest``, capacity and credit large
enough that nothing is dropped), so the figure includes its buffers, credit
accounting and frame coalescing.

Also measured: the pure dispatcher in process (publish-to-buffer p99 with
1,000 subscribers, dispatches/s to 10), and the memory a stalled subscriber
costs for its capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect

from bench.workqueue import percentile
from gateway.core.fanout import Dispatcher, Policy
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
DAPHNE_BASELINE = (sys.executable, "-m", "daphne", "-b", "127.0.0.1")


@dataclass
class Row:
    """One server at one subscriber count."""

    server: str
    subscribers: int
    messages: int
    delivered: int
    deliveries_per_s: float
    p50_ms: float
    p99_ms: float


@dataclass
class Target:
    """How to reach one server."""

    name: str
    base: str  # ws://127.0.0.1:PORT
    headers: dict[str, str]
    leasecast: bool

    def sub_url(self, topic: str, capacity: int) -> str:
        if self.leasecast:
            return f"{self.base}/ws/topics/{topic}/?capacity={capacity}&credit=1000000000"
        return f"{self.base}/sub/{topic}/"

    def pub_url(self) -> str:
        return f"{self.base}/ws/produce/" if self.leasecast else f"{self.base}/pub/"

    def publish_frame(self, topic: str, i: int) -> str:
        body = {"t": time.time(), "i": i}
        if self.leasecast:
            return orjson.dumps({"op": "publish", "topic": topic, "body": body}).decode()
        return orjson.dumps({"topic": topic, "body": body}).decode()


async def fanout_round(
    target: Target, n_subs: int, n_msgs: int, topic: str | None = None, connect_limit: int = 0
) -> Row:
    """One round: ``n_subs`` subscribers of a fresh topic (or ``topic``), ``n_msgs`` publishes.

    ``connect_limit``: at most this many subscriber handshakes at once (0: all at once).
    """
    topic = topic or f"bench{int(time.time() * 1000)}"
    handshakes = asyncio.Semaphore(connect_limit or n_subs)
    latencies: list[float] = []
    counts = [0] * n_subs
    finished = asyncio.Event()
    remaining = n_subs
    last_receipt = 0.0

    async def subscriber(k: int, ready: asyncio.Event, opened: list[int]) -> None:
        nonlocal remaining, last_receipt
        async with handshakes:
            ws = await connect(
                target.sub_url(topic, n_msgs), additional_headers=target.headers, max_size=None
            )
        async with ws:
            opened.append(k)
            if len(opened) == n_subs:
                ready.set()
            async for text in ws:
                frame = orjson.loads(text)
                now = time.time()
                if target.leasecast:
                    items = [item["body"] for item in frame["items"]]
                else:
                    items = [frame["body"]]
                for body in items:
                    latencies.append(now - body["t"])
                counts[k] += len(items)
                last_receipt = now
                if counts[k] >= n_msgs:
                    remaining -= 1
                    if remaining == 0:
                        finished.set()
                    return

    ready = asyncio.Event()
    opened: list[int] = []
    tasks = [asyncio.create_task(subscriber(k, ready, opened)) for k in range(n_subs)]
    await asyncio.wait_for(ready.wait(), 120)
    await asyncio.sleep(0.5)  # every subscription registered
    window = asyncio.Semaphore(100)
    async with connect(target.pub_url(), additional_headers=target.headers) as pub:

        async def replies() -> None:
            for _ in range(n_msgs):
                await pub.recv()
                window.release()

        reader = asyncio.create_task(replies())
        start = time.time()
        for i in range(n_msgs):
            await window.acquire()
            await pub.send(target.publish_frame(topic, i))
        await reader
        with contextlib.suppress(TimeoutError):  # then report what arrived
            await asyncio.wait_for(finished.wait(), 120)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    delivered = sum(counts)
    elapsed = max(last_receipt - start, 1e-9)
    return Row(
        target.name,
        n_subs,
        n_msgs,
        delivered,
        delivered / elapsed,
        percentile(latencies, 0.5) * 1000,
        percentile(latencies, 0.99) * 1000,
    )


def in_process_figures(quick: bool) -> dict[str, float]:
    """The pure dispatcher: publish-to-buffer latency and dispatch rate."""
    wide = Dispatcher(time.time)
    for _ in range(1000):
        wide.subscribe("t", capacity=1024, policy=Policy.DROP_OLDEST, credit=10**9)
    body = b'{"price": 1.2345, "symbol": "EURUSD"}'
    p50s, p99s = [], []
    for _ in range(5):  # the median of five runs: one run's p99 is mostly noise
        samples = []
        for _ in range(300 if quick else 2000):
            t0 = time.perf_counter()
            wide.publish("t", body)
            samples.append(time.perf_counter() - t0)
            wide.drain(10**9)  # the sender's share of the work, not timed here
        p50s.append(percentile(samples, 0.5))
        p99s.append(percentile(samples, 0.99))
    narrow = Dispatcher(time.time)
    for _ in range(10):
        narrow.subscribe("t", capacity=1024, policy=Policy.DROP_OLDEST, credit=10**9)
    n = 20_000 if quick else 200_000
    t0 = time.perf_counter()
    for i in range(n):
        narrow.publish("t", body)
        if i % 256 == 255:
            narrow.drain(10**9)
    elapsed = time.perf_counter() - t0
    return {
        "publish_p50_us_1000_subs": statistics.median(p50s) * 1e6,
        "publish_p99_us_1000_subs": statistics.median(p99s) * 1e6,
        "dispatches_per_s_10_subs": n * 10 / elapsed,
        "publishes_per_s_10_subs": n / elapsed,
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def memory_figures(target: Target, gateway: GatewayProcess) -> list[dict[str, Any]]:
    """RSS growth while a stalled subscriber (no credit) is sent far more than its capacity.

    Publishes go over a WebSocket in small frames, after a warm-up round of the
    same size, so the figure is what the buffer keeps, not the allocator's
    high-water mark from parsing large requests.
    """
    assert gateway.proc is not None
    body = {"pad": "x" * 1000}
    n = 50_000

    async def publish(topic: str) -> None:
        window = asyncio.Semaphore(100)
        async with connect(target.pub_url(), additional_headers=target.headers) as pub:

            async def replies() -> None:
                for _ in range(n):
                    await pub.recv()
                    window.release()

            reader = asyncio.create_task(replies())
            frame = orjson.dumps({"op": "publish", "topic": topic, "body": body}).decode()
            for _ in range(n):
                await window.acquire()
                await pub.send(frame)
            await reader

    await publish("warmup")  # no subscribers: only the transient costs
    rows = []
    for capacity in (1_000, 25_000):
        topic = f"mem{capacity}"
        async with connect(
            f"{target.base}/ws/topics/{topic}/?capacity={capacity}&credit=0",
            additional_headers=target.headers,
        ):
            await asyncio.sleep(0.3)
            before = rss_kib(gateway.proc.pid)
            await publish(topic)
            await asyncio.sleep(0.3)
            after = rss_kib(gateway.proc.pid)
        rows.append(
            {
                "capacity": capacity,
                "published": n,
                "body_bytes": len(orjson.dumps(body)),
                "rss_growth_mib": (after - before) / 1024,
                "capacity_mib": capacity * len(orjson.dumps(body)) / 2**20,
            }
        )
    return rows


def start_process(stack: ExitStack, args: list[str], port: int) -> int:
    """Start ``args`` (killed when ``stack`` closes) and wait until ``port`` answers; its pid."""
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(proc.kill)
    deadline = time.monotonic() + 30
    import socket

    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc.pid
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{args} did not start")


def table(rows: list[Row]) -> str:
    lines = [
        "| server | subscribers | messages | delivered | deliveries/s | p50 ms | p99 ms "
        "| vs Channels | vs websockets |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base: dict[tuple[str, int], float] = {
        (r.server, r.subscribers): r.deliveries_per_s for r in rows
    }
    for r in rows:
        ch = base.get(("channels-groups", r.subscribers))
        ws = base.get(("websockets-broadcast", r.subscribers))
        lines.append(
            f"| {r.server} | {r.subscribers:,} | {r.messages:,} | {r.delivered:,} "
            f"| {r.deliveries_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} "
            f"| {r.deliveries_per_s / ch:.1f}x | {r.deliveries_per_s / ws:.2f}x |"
            if ch and ws
            else f"| {r.server} | {r.subscribers:,} | {r.messages:,} | {r.delivered:,} "
            f"| {r.deliveries_per_s:,.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | - | - |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[Row] = []
    memory: list[dict[str, Any]] = []
    with ExitStack() as stack:
        var = Path(tempfile.mkdtemp(prefix="leasecast-bench-fanout-"))
        env = stack.enter_context(sqlite_database(var))
        targets: list[tuple[Target, Callable[[], None]]] = []
        gateways = {}
        for server in ("daphne", "uvicorn"):
            gw = GatewayProcess(env, var, name=f"fanout-{server}", server=server)
            gateways[server] = gw
        token = gateways["daphne"].issue_token("admin", name="bench")
        headers = {"Authorization": f"Bearer {token}"}
        channels_port, websockets_port = free_port(), free_port()
        plan: list[tuple[str, Callable[[], Target]]] = []

        def leasecast(server: str) -> Target:
            gw = gateways[server]
            gw.start()
            stack.callback(gw.stop)
            return Target(f"leasecast-{server}", gw.ws, headers, True)

        def channels_baseline() -> Target:
            start_process(
                stack,
                [*DAPHNE_BASELINE, "-p", str(channels_port), "bench.channels_baseline:application"],
                channels_port,
            )
            return Target("channels-groups", f"ws://127.0.0.1:{channels_port}", {}, False)

        def websockets_baseline() -> Target:
            start_process(
                stack,
                [sys.executable, "-m", "bench.websockets_baseline", str(websockets_port)],
                websockets_port,
            )
            return Target("websockets-broadcast", f"ws://127.0.0.1:{websockets_port}", {}, False)

        plan = [
            ("leasecast-daphne", lambda: leasecast("daphne")),
            ("leasecast-uvicorn", lambda: leasecast("uvicorn")),
            ("channels-groups", channels_baseline),
            ("websockets-broadcast", websockets_baseline),
        ]
        for name, make in plan:
            target = make()
            targets.append((target, lambda: None))
            for n_subs in args.subscribers:
                # Channels' per-socket group_send is slow: fewer messages keep it bounded.
                total = args.deliveries // (5 if name == "channels-groups" else 1)
                n_msgs = max(50, total // n_subs)
                row = await fanout_round(target, n_subs, n_msgs)
                rows.append(row)
                print(f"   {asdict(row)}", file=sys.stderr, flush=True)
            if name == "leasecast-daphne":
                memory = await memory_figures(target, gateways["daphne"])
                print(f"   memory {memory}", file=sys.stderr, flush=True)
    return {
        "rows": [asdict(r) for r in rows],
        "in_process": in_process_figures(args.quick),
        "memory": memory,
    }


# -- leasecast.Subscriber against a raw WebSocket subscriber (--clients)


async def clients_run(args: argparse.Namespace) -> dict[str, Any]:
    """``leasecast.Subscriber`` against bare WebSocket subscribers, on one gateway.

    One daphne gateway on SQLite; each round runs every arm once, in rotated
    order (each round starts one arm further on), with
    :func:`bench.peers.base.fanout` (the headline's fan-out: N subscribers, one
    publisher with 100 unconfirmed). Arms: ``raw`` (``/ws/topics/`` with
    credit 1,000,000,000, frames parsed with orjson), ``subscriber`` (the
    client as it comes: credit 256 granted back as it reads, one
    :class:`leasecast.Message` per iteration) and ``subscriber:N`` (credit
    N); ``subscriber@MODULE`` takes ``Subscriber`` from another module, e.g.
    an earlier commit's client renamed (``git archive COMMIT
    clients/python/src/leasecast``, the package and its imports renamed
    ``leasecast_before``, on ``PYTHONPATH``). Besides deliveries/s: the
    gateway's CPU and this load generator's per delivery (from ``/proc``),
    which a shared machine moves less.
    """
    from leasecast import Subscriber

    from bench.peers.base import PeerSubscriber, fanout
    from bench.peers.leasecast import RawSocketFanout, _ClientSubscriber
    from bench.procstat import cpu_of

    #: ``messages`` frames the subscribers of the current round received
    frames = [0]

    def counted(frame: dict[str, Any]) -> bool:
        if frame.get("op") == "messages":
            frames[0] += 1
        return False  # not consumed: it goes on to the subscriber

    class RawArm(RawSocketFanout):
        async def subscriber(self, topic: str, expected: int, on_bodies: Any) -> PeerSubscriber:
            ws = await connect(
                self.target.sub_url(topic, max(expected, 1024)),
                additional_headers=self.target.headers,
                max_size=None,
            )
            return _CountingSocket(ws, on_bodies)

    class _CountingSocket(PeerSubscriber):
        def __init__(self, ws: Any, on_bodies: Any) -> None:
            self.ws = ws
            self.reader = asyncio.create_task(self._read(on_bodies))

        async def _read(self, on_bodies: Any) -> None:
            async for text in self.ws:
                frame = orjson.loads(text)
                if frame.get("op") == "messages":
                    frames[0] += 1
                    on_bodies([item["body"]["t"] for item in frame["items"]])

        async def close(self) -> None:
            await self.ws.close()
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader

    class SubscriberArm(RawSocketFanout):
        def __init__(
            self, name: str, target: Target, pids: list[int], credit: int | None, module: str
        ) -> None:
            super().__init__(name, target, pids, f"{module}.Subscriber")
            self.credit = credit
            self.cls = importlib.import_module(module).Subscriber

        async def subscriber(self, topic: str, expected: int, on_bodies: Any) -> PeerSubscriber:
            token = self.target.headers["Authorization"].removeprefix("Bearer ")
            options: dict[str, Any] = {} if self.credit is None else {"credit": self.credit}
            sub = self.cls(
                self.target.base,
                topic,
                token=token,
                capacity=max(expected, 1024),
                reconnect=False,
                **options,
            )
            await sub.__aenter__()
            sub._link.on_push = counted  # counts the frames, hands each on
            return _IteratingSubscriber(sub, on_bodies, expected)

    class _IteratingSubscriber(_ClientSubscriber):
        """Reads as an application does (``async for``), and hands the send
        times on every 64 messages and at the last one: the raw arm hands
        them on once per frame, and a callback per message would measure
        the benchmark's bookkeeping, not the client. (Latencies are read at
        the hand-over, so they are a little longer than the raw arm's.)"""

        def __init__(self, subscriber: Subscriber, on_bodies: Any, expected: int) -> None:
            self.expected = expected
            super().__init__(subscriber, on_bodies)

        async def _read(self, on_bodies: Any) -> None:
            sent: list[float] = []
            left = self.expected
            async for message in self.subscriber:
                sent.append(message.body["t"])
                left -= 1
                if len(sent) >= 64 or left <= 0:
                    on_bodies(sent)
                    sent = []

    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        var = Path(tempfile.mkdtemp(prefix="leasecast-bench-clients-"))
        env = stack.enter_context(sqlite_database(var))
        gw = GatewayProcess(env, var, name="clients-daphne", server="daphne")
        token = gw.issue_token("admin", name="bench")
        gw.start()
        stack.callback(gw.stop)
        assert gw.proc is not None
        pids = [gw.proc.pid]
        target = Target("leasecast", gw.ws, {"Authorization": f"Bearer {token}"}, True)
        arms: list[RawSocketFanout] = []
        for name in args.arms:
            if name == "raw":
                arms.append(RawArm("raw", target, pids, "credit 1,000,000,000"))
            elif name.startswith("subscriber"):
                # subscriber[:CREDIT][@MODULE]
                spec, _, module = name.partition("@")
                credit = spec.partition(":")[2]
                arms.append(
                    SubscriberArm(
                        name, target, pids, int(credit) if credit else None, module or "leasecast"
                    )
                )
            else:
                raise SystemExit(f"unknown arm {name!r} (raw, or subscriber[:CREDIT][@MODULE])")
        n_msgs = max(50, args.deliveries // args.subscribers[0])
        print("   warming up", file=sys.stderr, flush=True)
        for arm in arms:
            await fanout(arm, args.subscribers[0], max(50, n_msgs // 4))
        for r in range(args.rounds):
            k = r % len(arms)
            for arm in arms[k:] + arms[:k]:
                await asyncio.sleep(0.2)
                gateway0, here0 = cpu_of(pids), time.process_time()
                frames[0] = 0
                result = await fanout(arm, args.subscribers[0], n_msgs)
                gateway_cpu, here_cpu = cpu_of(pids) - gateway0, time.process_time() - here0
                delivered = max(1, result.delivered)
                row = {
                    "arm": arm.name,
                    "round": r,
                    "subscribers": result.subscribers,
                    "messages": result.messages,
                    "delivered": result.delivered,
                    "deliveries_per_s": result.deliveries_per_s,
                    "p50_ms": percentile(result.latencies, 0.5) * 1000,
                    "p99_ms": percentile(result.latencies, 0.99) * 1000,
                    "gateway_us_per_delivery": gateway_cpu / delivered * 1e6,
                    "client_us_per_delivery": here_cpu / delivered * 1e6,
                    "items_per_frame": result.delivered / max(1, frames[0]),
                    "loadavg": Path("/proc/loadavg").read_text().split()[0],
                }
                rows.append(row)
                print(
                    f"   round {r + 1} {arm.name}: {row['deliveries_per_s']:,.0f} deliveries/s, "
                    f"{result.delivered:,} of {result.subscribers * result.messages:,}, "
                    f"gateway {row['gateway_us_per_delivery']:.2f} us, "
                    f"client {row['client_us_per_delivery']:.2f} us per delivery, "
                    f"{row['items_per_frame']:.1f} items a frame",
                    file=sys.stderr,
                    flush=True,
                )
    return {"clients": rows}


def client_cpu(arms: list[str], messages: int = 200_000, per_frame: int = 64) -> dict[str, float]:
    """CPU microseconds per message of each subscriber arm, with no socket and no
    gateway: the same ``messages`` frames (``per_frame`` items each) handed to a
    raw loop (orjson, a list of the bodies' ``t``) and to ``Subscriber``'s
    iteration (each arm's module, as in :func:`clients_run`), best of 5 rounds
    of ``time.process_time``. What a shared machine cannot move much.
    """

    class Conn:
        async def send(self, text: str) -> None:
            return None

    class Frames:
        """What ``Link.next`` gives: the frames, parsed one by one, then closed."""

        def __init__(self, frames: list[bytes], closed: type[Exception]) -> None:
            self.frames, self.i, self.conn, self.closed = frames, 0, Conn(), closed

        async def next(self) -> dict[str, Any]:
            if self.i >= len(self.frames):
                raise self.closed("done")
            self.i += 1
            frame: dict[str, Any] = orjson.loads(self.frames[self.i - 1])
            return frame

    frames, seq = [], 0
    for _ in range(messages // per_frame):
        items = []
        for _ in range(per_frame):
            seq += 1
            items.append({"seq": seq, "offset": seq, "body": {"t": 1.5}})
        frames.append(orjson.dumps({"op": "messages", "topic": "t", "items": items, "dropped": 0}))
    n = len(frames) * per_frame

    async def raw() -> None:
        link = Frames(frames, EOFError)
        with contextlib.suppress(EOFError):
            while True:
                frame = await link.next()
                _ = [item["body"]["t"] for item in frame["items"]]

    def iterating(module: str) -> Callable[[], Any]:
        errors = importlib.import_module(module.rpartition(".")[0] + ".errors" if "." in module
                                         else module + ".errors")  # fmt: skip
        cls = importlib.import_module(module).Subscriber

        async def run() -> None:
            sub = cls("ws://127.0.0.1:1", "t", token="x", reconnect=False)
            sub._link, sub._opened = Frames(frames, errors.ConnectionClosed), True
            async for message in sub:
                _ = message.body["t"]

        return run

    runs: dict[str, Callable[[], Any]] = {}
    for name in arms:
        if name == "raw":
            runs[name] = raw
        elif name.startswith("subscriber") and ":" not in name:
            runs[name] = iterating(name.partition("@")[2] or "leasecast")
    best = {name: float("inf") for name in runs}
    for _ in range(5):
        for name, run in runs.items():
            began = time.process_time()
            asyncio.run(run())
            best[name] = min(best[name], (time.process_time() - began) / n * 1e6)
    return best


def clients_table(rows: list[dict[str, Any]], arms: list[str]) -> str:
    """Median (min-max) per arm, and each arm's ratio to ``raw`` taken per round."""

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        med = fmt.format(statistics.median(values))
        return f"{med} ({fmt.format(min(values))}-{fmt.format(max(values))})"

    raw = {r["round"]: r["deliveries_per_s"] for r in rows if r["arm"] == "raw"}
    lines = [
        "| subscriber | rounds | delivered (min) | deliveries/s | vs raw, per round "
        "| gateway CPU us/delivery | client CPU us/delivery | items a frame | p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        ratios = [r["deliveries_per_s"] / raw[r["round"]] for r in mine if raw.get(r["round"])]
        lines.append(
            f"| {arm} | {len(mine)} | {min(r['delivered'] for r in mine):,} "
            f"| {spread([r['deliveries_per_s'] for r in mine], '{:,.0f}')} "
            f"| {spread(ratios, '{:.2f}x')} "
            f"| {spread([r['gateway_us_per_delivery'] for r in mine], '{:.2f}')} "
            f"| {spread([r['client_us_per_delivery'] for r in mine], '{:.2f}')} "
            f"| {spread([r.get('items_per_frame', 0.0) for r in mine], '{:.1f}')} "
            f"| {spread([r['p50_ms'] for r in mine], '{:.0f}')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fanout", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--subscribers", default="10,100,1000")
    parser.add_argument(
        "--deliveries", type=int, default=200_000, help="per round, all subscribers"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--clients",
        action="store_true",
        help="instead: leasecast.Subscriber against raw sockets (--arms, --rounds; "
        "the first --subscribers count, default 100 here)",
    )
    parser.add_argument("--arms", default="raw,subscriber", help="with --clients")
    parser.add_argument("--rounds", type=int, default=5, help="with --clients")
    parser.add_argument(
        "--client-cpu",
        action="store_true",
        help="instead: CPU per message of the --arms' iteration, frames from memory",
    )
    args = parser.parse_args(argv)
    if args.client_cpu:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        for name, us in client_cpu(arms).items():
            print(f"{name}: {us:.2f} us CPU per message (best of 5, 200,000 messages)")
        return
    if args.clients and args.subscribers == parser.get_default("subscribers"):
        args.subscribers = "100"
    args.subscribers = [int(x) for x in args.subscribers.split(",")]
    if args.quick:
        args.deliveries = 20_000
    started = time.time()
    if args.clients:
        args.arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        load_before = Path("/proc/loadavg").read_text().split()[:3]
        data = asyncio.run(clients_run(args))
        load_after = Path("/proc/loadavg").read_text().split()[:3]
        print(
            f"\nSubscribers: {args.subscribers[0]} x "
            f"{max(50, args.deliveries // args.subscribers[0]):,} messages, "
            f"{args.rounds} rounds, arms in rotated order:\n"
        )
        print(clients_table(data["clients"], args.arms))
        print(
            f"\n({time.time() - started:.0f} s; load average {' '.join(load_before)} before, "
            f"{' '.join(load_after)} after)"
        )
        if args.json:
            args.json.write_text(
                json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **data}, indent=2)
            )
        return
    data = asyncio.run(run(args))
    rows = [Row(**r) for r in data["rows"]]
    print(f"\nFan-out, about {args.deliveries:,} deliveries per round:\n")
    print(table(rows))
    ip = data["in_process"]
    print("\nIn process (pure dispatcher, no sockets):\n")
    print(
        f"- publish to 1,000 buffers: p50 {ip['publish_p50_us_1000_subs']:.0f} us, "
        f"p99 {ip['publish_p99_us_1000_subs']:.0f} us"
    )
    print(
        f"- 10 subscribers: {ip['publishes_per_s_10_subs']:,.0f} publishes/s = "
        f"{ip['dispatches_per_s_10_subs']:,.0f} dispatches/s"
    )
    print("\nA stalled subscriber (credit 0) sent 50,000 messages of about 1 KB:\n")
    for m in data["memory"]:
        print(
            f"- capacity {m['capacity']:,}: gateway RSS grew {m['rss_growth_mib']:.1f} MiB "
            f"(capacity x body = {m['capacity_mib']:.1f} MiB)"
        )
    print(f"\n({time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **data}, indent=2)
        )


if __name__ == "__main__":
    main()
