"""Work-queue benchmark: Leasecast (SQLite, PostgreSQL) against RabbitMQ, in one run.

    python -m bench.workqueue                      # everything, ~3 minutes
    python -m bench.workqueue --quick              # a smoke run, under a minute
    python -m bench.workqueue --backends sqlite,rabbitmq --messages 50000 --json out.json

For each backend, with the same load generator (one asyncio process, apart
from the server) and the same prefetch:

- **enqueue/s**: producers pipeline enqueues (a window of 500 unconfirmed),
  counting confirmations: Leasecast's `enqueued` reply (committed), RabbitMQ's
  publisher confirm (persistent message on a durable queue).
- **cycles/s**: producers and workers together on a fresh queue; a cycle is
  enqueue + delivery + ack, and the clock stops when the last ack is confirmed.
- **latency p50/p99**: enqueue-to-delivery at a paced 500 messages/s, so it
  measures the path rather than a backlog.
- Two styles: **v1**, one frame per message (`enqueue`, `deliver`, `ack`;
  RabbitMQ: one publish, one ack per message) and **batched**, Leasecast's
  extensions (`enqueue_many`, `?batch=`, `ack_many`; RabbitMQ: acks with
  `multiple=True`, the nearest thing it has).
- **in flight**: lease latency (enqueue to delivery to an idle worker) and ack
  latency (ack to `acked`) on an empty queue and with 100,000 messages leased
  and unacked by 100 other sockets.

Results are ratios within one run; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess

RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/"
WINDOW = 500


@dataclass
class Result:
    """One backend's figures."""

    backend: str
    style: str
    enqueue_per_s: float = 0.0
    cycles_per_s: float = 0.0
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    notes: list[str] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``, in the same unit."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- Leasecast ----------------------------------------------------------------


def ack_frame(receipt: str) -> str:
    """A v1 ``ack`` frame."""
    return f'{{"op":"ack","receipt":"{receipt}"}}'


class LeasecastTarget:
    """A running gateway and how to drive it."""

    def __init__(self, name: str, gateway: GatewayProcess, token: str) -> None:
        self.name = name
        self.gateway = gateway
        self.token = token
        self.headers = {"Authorization": f"Bearer {token}"}

    async def socket(self, path: str) -> ClientConnection:
        return await connect(self.gateway.ws + path, additional_headers=self.headers, max_size=None)

    async def produce(
        self,
        queue: str,
        n: int,
        *,
        batched: bool,
        paced: float = 0,
        fields: Callable[[int], dict[str, Any]] | None = None,
    ) -> float:
        """Enqueue ``n`` timestamped bodies; returns the seconds until all were confirmed.

        ``fields(i)``, if given, adds fields to the ``i``-th message (``group``,
        ``priority``, ``ttl``: protocol 1.1) and its body carries ``i`` as ``"i"``.
        """
        per_frame = 100 if batched else 1
        frames = (n + per_frame - 1) // per_frame
        window = asyncio.Semaphore(max(1, WINDOW // per_frame))

        def message(i: int) -> dict[str, Any]:
            if fields is None:
                return {"body": {"t": time.time()}}
            return {"body": {"t": time.time(), "i": i}, **fields(i)}

        start = time.perf_counter()
        async with await self.socket("/ws/produce/") as ws:

            async def confirmations() -> None:
                for _ in range(frames):
                    reply = orjson.loads(await ws.recv())
                    if reply["op"] == "error":
                        raise RuntimeError(reply)
                    window.release()

            reader = asyncio.create_task(confirmations())
            for i in range(frames):
                await window.acquire()
                if paced:
                    await asyncio.sleep(max(0.0, start + i / paced - time.perf_counter()))
                if batched:
                    first = i * per_frame
                    count = min(per_frame, n - first)
                    messages = [message(k) for k in range(first, first + count)]
                    frame: dict[str, Any] = {"op": "enqueue_many", "queue": queue}
                    frame["messages"] = messages
                else:
                    frame = {"op": "enqueue", "queue": queue, **message(i)}
                await ws.send(orjson.dumps(frame).decode())
            await reader
        return time.perf_counter() - start

    async def consume(
        self,
        queue: str,
        n: int,
        workers: int,
        prefetch: int,
        *,
        batched: bool,
        latencies: list[float],
        done: asyncio.Event | None = None,
    ) -> None:
        """Receive and ack ``n`` messages over ``workers`` sockets, until every ack is confirmed.

        ``done``, if given, is set when the last ack is confirmed: a caller
        that awaits it stops its clock there, before the sockets close (idle
        workers notice within their 1 s receive timeout).
        """
        acked = 0
        done = done or asyncio.Event()
        query = f"prefetch={prefetch}" + (f"&batch={prefetch}" if batched else "")

        async def worker() -> None:
            nonlocal acked
            async with await self.socket(f"/ws/queues/{queue}/?{query}") as ws:
                while not done.is_set():
                    try:
                        text = await asyncio.wait_for(ws.recv(), 1.0)
                    except TimeoutError:
                        continue
                    frame = orjson.loads(text)
                    op = frame["op"]
                    if op == "deliver":
                        latencies.append(time.time() - frame["body"]["t"])
                        await ws.send(ack_frame(frame["receipt"]))
                    elif op == "deliveries":
                        now = time.time()
                        latencies.extend(now - item["body"]["t"] for item in frame["items"])
                        receipts = [item["receipt"] for item in frame["items"]]
                        await ws.send(
                            orjson.dumps({"op": "ack_many", "receipts": receipts}).decode()
                        )
                    elif op in ("acked", "acked_many"):
                        acked += frame.get("acked", 1)
                        if acked >= n:
                            done.set()
                    else:
                        raise RuntimeError(frame)

        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        await done.wait()
        await asyncio.gather(*tasks)


async def leasecast_figures(
    target: LeasecastTarget, n: int, workers: int, prefetch: int, batched: bool
) -> Result:
    result = Result(target.name, "batched" if batched else "v1")
    stamp = f"{int(time.time() * 1000)}{'b' if batched else 'v'}"
    seconds = await target.produce(f"enq{stamp}", n, batched=batched)
    result.enqueue_per_s = n / seconds

    latencies: list[float] = []
    queue = f"cyc{stamp}"
    consumer = asyncio.create_task(
        target.consume(queue, n, workers, prefetch, batched=batched, latencies=latencies)
    )
    await asyncio.sleep(0.3)  # workers connected and waiting
    start = time.perf_counter()
    await target.produce(queue, n, batched=batched)
    await consumer
    result.cycles_per_s = n / (time.perf_counter() - start)

    paced: list[float] = []
    queue = f"lat{stamp}"
    count = 1500
    consumer = asyncio.create_task(
        target.consume(queue, count, workers, prefetch, batched=batched, latencies=paced)
    )
    await asyncio.sleep(0.3)
    await target.produce(queue, count, batched=False, paced=500)
    await consumer
    result.latency_p50_ms = percentile(paced, 0.5) * 1000
    result.latency_p99_ms = percentile(paced, 0.99) * 1000
    return result


async def inflight_figures(
    target: LeasecastTarget,
    held: int,
    samples: int = 200,
    fields: Callable[[int], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Lease and ack latency on an empty queue, then with ``held`` messages leased and unacked.

    ``fields`` adds fields to the held messages (as for :meth:`LeasecastTarget.produce`).
    """
    queue = f"inflight{int(time.time() * 1000)}"

    async def probe() -> tuple[list[float], list[float]]:
        lease, ack = [], []
        async with (
            await target.socket("/ws/produce/") as producer,
            await target.socket(f"/ws/queues/{queue}/?prefetch=1&visibility_timeout=600") as w,
        ):
            for i in range(samples):
                t0 = time.perf_counter()
                await producer.send(
                    orjson.dumps({"op": "enqueue", "queue": queue, "body": i}).decode()
                )
                await producer.recv()
                frame = orjson.loads(await w.recv())
                t1 = time.perf_counter()
                await w.send(ack_frame(frame["receipt"]))
                await w.recv()
                lease.append(t1 - t0)
                ack.append(time.perf_counter() - t1)
        return lease, ack

    empty_lease, empty_ack = await probe()
    # Fill: enqueue `held` messages and lease them all to 100 sockets that never ack.
    await target.produce(queue, held, batched=True, fields=fields)
    holders = []
    per_socket = min(1000, -(-held // 100))
    leased = 0
    for _ in range(-(-held // per_socket)):
        ws = await target.socket(
            f"/ws/queues/{queue}/?prefetch={per_socket}&batch={per_socket}&visibility_timeout=600"
        )
        holders.append(ws)
        while True:
            frame = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            leased += len(frame["items"])
            if leased % per_socket == 0 or leased >= held:
                break
    full_lease, full_ack = await probe()
    for ws in holders:
        await ws.close()
    med = statistics.median
    return {
        "backend": target.name,
        "held": leased,
        "lease_ms_empty": med(empty_lease) * 1000,
        "lease_ms_full": med(full_lease) * 1000,
        "ack_ms_empty": med(empty_ack) * 1000,
        "ack_ms_full": med(full_ack) * 1000,
    }


# -- RabbitMQ -----------------------------------------------------------------


async def rabbit_figures(
    n: int,
    workers: int,
    prefetch: int,
    batched: bool,
    *,
    enqueue: bool = True,
    latency_rate: float = 500,
    latency_count: int = 1500,
) -> Result:
    """RabbitMQ's figures; ``enqueue=False`` skips enqueue/s, ``latency_count=0`` the latency.

    The latency is measured at a paced ``latency_rate`` messages/s.
    """
    import aio_pika

    result = Result("rabbitmq", "batched" if batched else "v1")
    if batched:
        result.notes.append("publishes one by one (AMQP has no batch publish); acks multiple=True")
    connection = await aio_pika.connect_robust(RABBIT_URL)
    async with connection:
        stamp = f"lc-bench-{int(time.time() * 1000)}"

        async def produce(queue: str, count: int, paced: float = 0) -> float:
            channel = await connection.channel(publisher_confirms=True)
            window = asyncio.Semaphore(WINDOW)
            pending: set[asyncio.Task[Any]] = set()
            start = time.perf_counter()

            async def publish_one(body: bytes) -> None:
                try:
                    await channel.default_exchange.publish(
                        aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=queue,
                    )
                finally:
                    window.release()

            for i in range(count):
                await window.acquire()
                if paced:
                    await asyncio.sleep(max(0.0, start + i / paced - time.perf_counter()))
                task = asyncio.create_task(publish_one(orjson.dumps({"t": time.time()})))
                pending.add(task)
                task.add_done_callback(pending.discard)
            await asyncio.gather(*pending)
            await channel.close()
            return time.perf_counter() - start

        async def consume(queue: str, count: int, latencies: list[float]) -> None:
            done = asyncio.Event()
            acked = 0

            def handler() -> tuple[Callable[[Any], Awaitable[None]], Callable[[], Awaitable[None]]]:
                pending: list[Any] = []  # delivered, not yet acked (batched style)

                async def flush() -> None:
                    nonlocal acked
                    if pending:
                        last, count_now = pending[-1], len(pending)
                        pending.clear()
                        await last.ack(multiple=True)
                        acked += count_now
                        if acked >= count:
                            done.set()

                async def on_message(message: Any) -> None:
                    nonlocal acked
                    latencies.append(time.time() - orjson.loads(message.body)["t"])
                    if batched:
                        pending.append(message)
                        if len(pending) >= prefetch // 2:
                            await flush()
                    else:
                        await message.ack()
                        acked += 1
                        if acked >= count:
                            done.set()

                return on_message, flush

            channels, flushers = [], []
            for _ in range(workers):
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=prefetch)
                q = await channel.declare_queue(queue, durable=True)
                on_message, flush = handler()
                await q.consume(on_message)
                channels.append(channel)
                flushers.append(flush)

            async def flush_idle() -> None:
                # Batched style: ack what a quiet worker holds, as a client would.
                while not done.is_set():
                    await asyncio.sleep(0.02)
                    for flush in flushers:
                        await flush()

            ticker = asyncio.create_task(flush_idle())
            await done.wait()
            await ticker
            for channel in channels:
                await channel.close()

        setup = await connection.channel()
        for name in ("enq", "cyc", "lat"):
            await setup.declare_queue(f"{stamp}-{name}", durable=True)
        if enqueue:
            result.enqueue_per_s = n / await produce(f"{stamp}-enq", n)

        latencies: list[float] = []
        consumer = asyncio.create_task(consume(f"{stamp}-cyc", n, latencies))
        await asyncio.sleep(0.3)
        start = time.perf_counter()
        await produce(f"{stamp}-cyc", n)
        await consumer
        result.cycles_per_s = n / (time.perf_counter() - start)

        paced: list[float] = []
        count = latency_count
        if count:
            consumer = asyncio.create_task(consume(f"{stamp}-lat", count, paced))
            await asyncio.sleep(0.3)
            await produce(f"{stamp}-lat", count, paced=latency_rate)
            await consumer
        result.latency_p50_ms = percentile(paced, 0.5) * 1000
        result.latency_p99_ms = percentile(paced, 0.99) * 1000
        for name in ("enq", "cyc", "lat"):
            await setup.queue_delete(f"{stamp}-{name}")
    return result


def rabbit_unavailable() -> str | None:
    """Why RabbitMQ cannot be used, or None."""
    import socket

    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=2):
            return None
    except OSError as exc:
        return f"RabbitMQ at 127.0.0.1:5672 is not reachable: {exc}"


# -- the run ------------------------------------------------------------------


def start_gateway(
    stack: ExitStack, backend: str, server: str = "daphne", extra_env: dict[str, str] | None = None
) -> LeasecastTarget | str:
    """A gateway on a fresh database of ``backend``, or the reason it cannot run.

    ``server`` is the ASGI server: daphne (as ``make run``) or uvicorn;
    ``extra_env`` adds settings (``REDIS_URL``, for one).
    """
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-bench-{backend}-"))
    database: AbstractContextManager[dict[str, str]]
    if backend == "postgres":
        reason = postgres_unavailable()
        if reason:
            return reason
        database = postgres_database(var)
    else:
        database = sqlite_database(var)
    env = {**stack.enter_context(database), **(extra_env or {})}
    gateway = GatewayProcess(env, var, name=f"bench-{backend}", server=server)
    gateway.start()
    stack.callback(gateway.stop)
    token = gateway.issue_token("admin", name="bench")
    return LeasecastTarget(f"leasecast-{backend}", gateway, token)


def table(results: list[Result]) -> str:
    """Markdown table with the RabbitMQ ratios of the same style."""
    rabbit = {r.style: r for r in results if r.backend == "rabbitmq"}
    lines = [
        "| backend | style | enqueue/s | cycles/s | p50 ms | p99 ms "
        "| enqueue vs RabbitMQ | cycles vs RabbitMQ |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        base = rabbit.get(r.style)
        ratio_e = f"{r.enqueue_per_s / base.enqueue_per_s:.2f}x" if base else "-"
        ratio_c = f"{r.cycles_per_s / base.cycles_per_s:.2f}x" if base else "-"
        lines.append(
            f"| {r.backend} | {r.style} | {r.enqueue_per_s:,.0f} | {r.cycles_per_s:,.0f} "
            f"| {r.latency_p50_ms:.1f} | {r.latency_p99_ms:.1f} | {ratio_e} | {ratio_c} |"
        )
    return "\n".join(lines)


def inflight_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | leased and unacked | lease ms empty | lease ms full | ratio "
        "| ack ms empty | ack ms full | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['held']:,} | {r['lease_ms_empty']:.2f} "
            f"| {r['lease_ms_full']:.2f} "
            f"| {r['lease_ms_full'] / r['lease_ms_empty']:.2f}x | {r['ack_ms_empty']:.2f} "
            f"| {r['ack_ms_full']:.2f} | {r['ack_ms_full'] / r['ack_ms_empty']:.2f}x |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: list[Result] = []
    inflight: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    styles = [False, True]
    with ExitStack() as stack:
        for backend in args.backends:
            print(f"== {backend}", file=sys.stderr, flush=True)
            if backend == "rabbitmq":
                reason = rabbit_unavailable()
                if reason:
                    skipped[backend] = reason
                    print(f"   skipped: {reason}", file=sys.stderr)
                    continue
                for batched in styles:
                    results.append(
                        await rabbit_figures(args.messages, args.workers, args.prefetch, batched)
                    )
                    print(f"   {asdict(results[-1])}", file=sys.stderr, flush=True)
                continue
            target = start_gateway(stack, backend)
            if isinstance(target, str):
                skipped[backend] = target
                print(f"   skipped: {target}", file=sys.stderr)
                continue
            for batched in styles:
                results.append(
                    await leasecast_figures(
                        target, args.messages, args.workers, args.prefetch, batched
                    )
                )
                print(f"   {asdict(results[-1])}", file=sys.stderr, flush=True)
            if args.inflight:
                inflight.append(await inflight_figures(target, args.inflight))
                print(f"   {inflight[-1]}", file=sys.stderr, flush=True)
            target.gateway.stop()
    return {"results": [asdict(r) for r in results], "inflight": inflight, "skipped": skipped}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.workqueue", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--backends", default="sqlite,postgres,rabbitmq")
    parser.add_argument("--inflight", type=int, default=100_000, help="0 to skip")
    parser.add_argument("--quick", action="store_true", help="5,000 messages, 10,000 in flight")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.quick:
        args.messages, args.inflight = 5_000, min(args.inflight, 10_000)
    started = time.time()
    data = asyncio.run(run(args))
    results = [Result(**r) for r in data["results"]]
    shape = f"{args.messages:,} messages, {args.workers} workers, prefetch {args.prefetch}"
    print(f"\nWork queue, {shape}:\n")
    print(table(results))
    if data["inflight"]:
        print("\nLatency with messages in flight (median of 200 probes):\n")
        print(inflight_table(data["inflight"]))
    for backend, reason in data["skipped"].items():
        print(f"\nskipped {backend}: {reason}")
    print(f"\n({time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, **data}, indent=2)
        )


if __name__ == "__main__":
    main()
