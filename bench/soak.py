"""Soak: mixed load against one gateway process for minutes, memory and errors sampled.

    python -m bench.soak                 # 10 minutes, SQLite
    python -m bench.soak --minutes 3
    python -m bench.soak --database-url postgresql://postgres@127.0.0.1:5432/leasecast_soak

Not part of CI. One daphne process (``python -m gateway.serve``, as ``make run``
starts it) on a fresh database takes, all at once:

- producers: ENQUEUE to several queues and PUBLISH to several topics at a
  paced rate (``--enqueue-rate``, ``--publish-rate`` per second);
- workers that ack every delivery; one per queue reconnects every 5-20 s,
  half the time by dropping the TCP connection with leases held (released at
  once, redelivered to the others);
- subscribers that grant credit as they go; some stay for the whole run and
  must hear every publish in order, the others reconnect every 5-20 s.

Every ``--interval`` seconds (default 10) it prints a row: the gateway's RSS
(``VmRSS``), its sockets, the messages so far, reconnects, and errors: error
frames, unexpected closes and broken order on the client side; ``ERROR`` and
``Traceback`` lines in the gateway's log. At the end the producers stop, the
rest drains, and it checks that every confirmed enqueue was acked and every
steady subscriber heard every publish; the exit status is 1 if anything was
lost or any error seen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.clients import http
from tests.support.databases import base_env, manage, sqlite_database
from tests.support.gateways import GatewayProcess

MIB = 1024 * 1024


def rss_mib(pid: int) -> float:
    """The process's resident set from ``/proc/PID/status``."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Figures:
    """What the clients saw, added up."""

    enqueued: set[str] = field(default_factory=set)  # confirmed ids
    acked: set[str] = field(default_factory=set)
    acks: int = 0
    redelivered: int = 0
    published: dict[str, int] = field(default_factory=dict)  # per topic, confirmed
    heard: int = 0  # messages received by all subscribers together
    steady_heard: dict[int, int] = field(default_factory=dict)  # steady subscriber -> count
    dropped: int = 0
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors.append(what)
        if len(self.errors) <= 20:
            print(f"  error: {what}", file=sys.stderr, flush=True)


@dataclass
class Sample:
    t: float
    rss: float
    sockets: int
    enqueued: int
    acked: int
    published: int
    heard: int
    dropped: int
    reconnects: int
    client_errors: int
    log_errors: int


class Soak:
    """The load, the checks and the samples of one run."""

    def __init__(self, args: argparse.Namespace, gateway: GatewayProcess, token: str) -> None:
        self.args = args
        self.gateway = gateway
        self.headers = {"Authorization": f"Bearer {token}"}
        self.token = token
        self.figures = Figures()
        self.samples: list[Sample] = []
        self.producing = True
        self.running = True
        run = f"soak{int(time.time())}"
        self.queues = [f"{run}.q{i}" for i in range(args.queues)]
        self.topics = [f"{run}.t{i}" for i in range(args.topics)]
        self.refs = itertools.count()
        self.started = time.monotonic()

    async def connect(self, path: str) -> ClientConnection:
        return await connect(self.gateway.ws + path, additional_headers=self.headers, max_size=None)

    # -- producers

    async def produce(self) -> None:
        """Enqueue and publish at the paced rates, up to 1,000 frames unconfirmed."""
        f = self.figures
        window = asyncio.Semaphore(1000)
        async with await self.connect("/ws/produce/") as ws:

            async def replies() -> None:
                async for text in ws:
                    reply = orjson.loads(text)
                    window.release()
                    ref = reply.get("ref", "")
                    if reply["op"] == "enqueued":
                        f.enqueued.add(reply["id"])
                    elif reply["op"] == "published":
                        f.published[reply["topic"]] = f.published.get(reply["topic"], 0) + 1
                    else:
                        f.error(f"producer got {reply} for {ref}")

            reader = asyncio.create_task(replies())
            tick = 0.1
            start = time.monotonic()
            n = 0
            while self.producing:
                n += 1
                for _ in range(round(self.args.enqueue_rate * tick)):
                    await window.acquire()
                    queue = random.choice(self.queues)
                    frame = {"op": "enqueue", "queue": queue, "body": {"n": next(self.refs)}}
                    await ws.send(orjson.dumps({**frame, "ref": "e"}).decode())
                for _ in range(round(self.args.publish_rate * tick)):
                    await window.acquire()
                    topic = random.choice(self.topics)
                    frame = {"op": "publish", "topic": topic, "body": {"n": next(self.refs)}}
                    await ws.send(orjson.dumps({**frame, "ref": "p"}).decode())
                await asyncio.sleep(max(0.0, start + n * tick - time.monotonic()))
            # Every frame sent is confirmed before the producer is done.
            for _ in range(1000):
                await window.acquire()
            reader.cancel()

    # -- workers

    async def work(self, queue: str, reconnecting: bool) -> None:
        f = self.figures
        while self.running:
            stay = random.uniform(5, 20) if reconnecting else float("inf")
            until = time.monotonic() + stay
            try:
                ws = await self.connect(f"/ws/queues/{queue}/?prefetch=20")
            except OSError as exc:
                f.error(f"worker could not connect: {exc!r}")
                await asyncio.sleep(1)
                continue
            abrupt = random.random() < 0.5
            unconfirmed = 0  # acks sent, replies not yet in
            try:
                # Past its time the worker acks nothing more, and leaves once every
                # ack it sent is confirmed: what it still holds is released.
                while unconfirmed or (self.running and time.monotonic() < until):
                    try:
                        text = await asyncio.wait_for(ws.recv(), 0.5)
                    except TimeoutError:
                        continue
                    frame = orjson.loads(text)
                    if frame["op"] == "deliver":
                        if frame["deliveries"] > 1:
                            f.redelivered += 1
                        if not (self.running and time.monotonic() < until):
                            continue
                        ack = {"op": "ack", "receipt": frame["receipt"], "ref": frame["id"]}
                        await ws.send(orjson.dumps(ack).decode())
                        unconfirmed += 1
                    elif frame["op"] == "acked":
                        unconfirmed -= 1
                        f.acks += 1
                        f.acked.add(frame["ref"])
                    else:
                        unconfirmed -= frame["op"] == "error"
                        f.error(f"worker on {queue} got {frame}")
            except ConnectionClosed as exc:
                f.error(f"worker on {queue} closed by the gateway: {exc!r}")
            finally:
                if abrupt and self.running:
                    ws.transport.abort()  # leases held: released at once, redelivered
                else:
                    await ws.close()
            if self.running:
                f.reconnects += 1

    # -- subscribers

    async def listen(self, topic: str, k: int, steady: bool) -> None:
        f = self.figures
        if steady:
            f.steady_heard[k] = 0
        while self.running:
            until = time.monotonic() + (float("inf") if steady else random.uniform(5, 20))
            try:
                ws = await self.connect(f"/ws/topics/{topic}/?capacity=100000&credit=1000")
            except OSError as exc:
                f.error(f"subscriber could not connect: {exc!r}")
                await asyncio.sleep(1)
                continue
            seq, granted, got = 0, 1000, 0
            try:
                while self.running and time.monotonic() < until:
                    try:
                        text = await asyncio.wait_for(ws.recv(), 0.5)
                    except TimeoutError:
                        continue
                    frame = orjson.loads(text)
                    if frame["op"] != "messages":
                        f.error(f"subscriber of {topic} got {frame}")
                        continue
                    f.dropped += frame["dropped"]
                    if frame["dropped"] and steady:
                        f.error(f"steady subscriber of {topic} lost {frame['dropped']}")
                    for item in frame["items"]:
                        if item["seq"] <= seq:
                            f.error(f"subscriber of {topic}: seq {item['seq']} after {seq}")
                        seq = item["seq"]
                    got += len(frame["items"])
                    f.heard += len(frame["items"])
                    if steady:
                        f.steady_heard[k] += len(frame["items"])
                    if granted - got < 500:
                        await ws.send('{"op": "credit", "n": 1000}')
                        granted += 1000
            except ConnectionClosed as exc:
                f.error(f"subscriber of {topic} closed by the gateway: {exc!r}")
            finally:
                await ws.close()
            if self.running and not steady:
                f.reconnects += 1

    # -- samples

    def log_errors(self) -> int:
        text = self.gateway.log_text()
        return text.count("Traceback") + sum(1 for line in text.splitlines() if " ERROR " in line)

    async def sample(self) -> Sample:
        assert self.gateway.proc is not None
        status, stats = await asyncio.to_thread(
            http, "GET", f"{self.gateway.http}/api/stats", self.token
        )
        sockets = len(stats["sockets"]) if status == 200 else -1
        if status != 200:
            self.figures.error(f"/api/stats answered {status}: {stats}")
        f = self.figures
        return Sample(
            t=time.monotonic() - self.started,
            rss=rss_mib(self.gateway.proc.pid),
            sockets=sockets,
            enqueued=len(f.enqueued),
            acked=len(f.acked),
            published=sum(f.published.values()),
            heard=f.heard,
            dropped=f.dropped,
            reconnects=f.reconnects,
            client_errors=len(f.errors),
            log_errors=self.log_errors(),
        )

    async def sampler(self) -> None:
        print(HEADER, flush=True)
        while self.running:
            sample = await self.sample()
            self.samples.append(sample)
            print(row(sample), flush=True)
            await asyncio.sleep(self.args.interval)

    # -- the run

    async def run(self) -> bool:
        args = self.args
        clients = [
            self.work(queue, reconnecting=i == 0)
            for queue in self.queues
            for i in range(args.workers_per_queue)
        ]
        clients += [
            self.listen(topic, k, steady=i < args.steady_per_topic)
            for k, (topic, i) in enumerate(
                (t, i) for t in self.topics for i in range(args.subscribers_per_topic)
            )
        ]
        tasks = [asyncio.create_task(c) for c in clients]
        await asyncio.sleep(1)  # every subscriber is in before the first publish
        sampler = asyncio.create_task(self.sampler())
        producer = asyncio.create_task(self.produce())
        await asyncio.sleep(args.minutes * 60)
        self.producing = False
        await producer
        print("-- producers stopped; draining", flush=True)
        drained = await self.drain()
        self.running = False
        await asyncio.gather(*tasks, return_exceptions=True)
        sampler.cancel()
        final = await self.sample()
        self.samples.append(final)
        print(row(final))
        return self.report(drained)

    async def drain(self, limit: float = 120) -> bool:
        f = self.figures
        steady = self.args.steady_per_topic
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            per_topic = sum(f.published.values()) / max(1, len(self.topics))
            heard_all = all(
                n == f.published.get(self.topics[k // self.args.subscribers_per_topic], 0)
                for k, n in f.steady_heard.items()
            )
            if f.enqueued <= f.acked and heard_all:
                return True
            await asyncio.sleep(0.5)
        missing = len(f.enqueued - f.acked)
        f.error(f"after draining: {missing} confirmed enqueues never acked")
        short = {
            k: n
            for k, n in f.steady_heard.items()
            if n != f.published.get(self.topics[k // self.args.subscribers_per_topic], 0)
        }
        if short:
            f.error(f"steady subscribers missing publishes: {short} ({steady}/topic, {per_topic})")
        return False

    def report(self, drained: bool) -> bool:
        f = self.figures
        counts = []
        for queue in self.queues:
            status, body = http("GET", f"{self.gateway.http}/api/queues/{queue}", self.token)
            if status == 200:
                counts.append(sum(body[k] for k in ("visible", "delayed", "in_flight", "dead")))
        left = sum(counts)
        first, last = self.samples[0], self.samples[-1]
        after_warmup = next((s for s in self.samples if s.t >= 60), first)
        peak = max(s.rss for s in self.samples)
        log_errors = last.log_errors
        print()
        print(f"duration            {last.t:.0f} s (load {self.args.minutes:g} min)")
        print(
            f"gateway RSS         start {first.rss:.0f} MiB, after 1 min {after_warmup.rss:.0f}, "
            f"end {last.rss:.0f}, peak {peak:.0f}"
        )
        print(
            f"enqueued / acked    {len(f.enqueued)} / {len(f.acked)} ids "
            f"({f.acks} acks, {f.redelivered} redeliveries), {left} left in the queues"
        )
        print(
            f"published / heard   {sum(f.published.values())} / {f.heard} deliveries, "
            f"{f.dropped} dropped"
        )
        print(f"reconnects          {f.reconnects}")
        print(f"errors              {len(f.errors)} client, {log_errors} in the gateway log")
        ok = drained and not f.errors and log_errors == 0 and left == 0
        print("result              " + ("OK: nothing lost, no errors" if ok else "FAILED"))
        return ok


HEADER = (
    f"{'t s':>6} {'RSS MiB':>8} {'sockets':>7} {'enqueued':>9} {'acked':>9} {'published':>9} "
    f"{'heard':>10} {'dropped':>7} {'reconn':>6} {'err cli':>7} {'err log':>7}"
)


def row(s: Sample) -> str:
    return (
        f"{s.t:6.0f} {s.rss:8.1f} {s.sockets:7d} {s.enqueued:9d} {s.acked:9d} {s.published:9d} "
        f"{s.heard:10d} {s.dropped:7d} {s.reconnects:6d} {s.client_errors:7d} {s.log_errors:7d}"
    )


@contextmanager
def database(url: str | None, var: Path) -> Iterator[dict[str, str]]:
    """A migrated SQLite database under ``var``, or the PostgreSQL one at ``url``."""
    if url is None:
        with sqlite_database(var) as env:
            yield env
        return
    env = base_env(var)
    env["DATABASE_URL"] = url
    manage(env, "migrate", "--noinput", "-v0")
    yield env


async def main_async(args: argparse.Namespace) -> bool:
    var = Path(tempfile.mkdtemp(prefix="leasecast-soak-"))
    with database(args.database_url, var) as env:
        gateway = GatewayProcess(env, var, name="soak")
        gateway.start()
        try:
            token = gateway.issue_token("admin", name="soak")
            print(
                f"gateway pid {gateway.proc.pid if gateway.proc else '?'}, log {gateway.log_path}"
            )
            return await Soak(args, gateway, token).run()
        finally:
            gateway.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="of load (default 10)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--enqueue-rate", type=float, default=200.0, help="enqueues per second")
    parser.add_argument("--publish-rate", type=float, default=200.0, help="publishes per second")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--workers-per-queue", type=int, default=3, help="one of them reconnects")
    parser.add_argument("--topics", type=int, default=4)
    parser.add_argument("--subscribers-per-topic", type=int, default=5)
    parser.add_argument("--steady-per-topic", type=int, default=2, help="the rest reconnect")
    parser.add_argument("--database-url", help="PostgreSQL; default a fresh SQLite file")
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        ok = asyncio.run(main_async(args))
        sys.exit(0 if ok else 1)
    sys.exit(130)


if __name__ == "__main__":
    main()
