"""Where an enqueue's milliseconds go: one paced producer, idle workers, the client's default path.

    python -m bench.latency_path                          # SQLite and PostgreSQL, 2 rounds each
    python -m bench.latency_path --databases sqlite --messages 3000 --rate 500

One daphne gateway per database (as ``make run`` starts it); one
``leasecast.Producer`` enqueues at a paced ``--rate`` (one task per call, as
the headline's latency run does) and ``--workers`` ``leasecast.Worker``s with
``--prefetch`` receive and ack. For every message it records three times on
the load generator's clock: the ``enqueue`` call, its reply (``enqueued``:
the enqueue's transaction committed) and its delivery to a worker, and
prints per round the p50 and p99 of

- **enqueue -> delivery**: what ``bench.headline``'s latency row measures;
- **enqueue -> reply**: the producer's round trip, commit included;
- **reply -> delivery**: what the delivery costs after the commit (negative
  when the delivery frame was read before the reply frame: both leave the
  gateway after the same commit), and how many deliveries came first.

A delivery that waits for a lease round of its own after the enqueue's
commit shows as a positive reply -> delivery; one leased in the enqueue's
own transaction as about zero.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from contextlib import ExitStack
from typing import Any

from leasecast import Delivery, Producer, Worker

from bench.peers.base import percentile
from bench.procstat import loadavg
from bench.workqueue import start_gateway


async def one_round(
    url: str, token: str, queue: str, args: argparse.Namespace
) -> dict[str, float | int]:
    """One paced run on a fresh queue: the percentiles of the three spans, in ms."""
    n = args.messages
    sent: list[float] = [0.0] * n
    replied: list[float] = [0.0] * n
    got: list[float] = [0.0] * n
    received = 0
    done = asyncio.Event()
    acks: set[asyncio.Task[Any]] = set()

    async def consume(worker: Worker) -> None:
        nonlocal received
        delivery: Delivery
        async for delivery in worker:
            got[delivery.body["i"]] = time.perf_counter()
            task = asyncio.ensure_future(delivery.ack())
            acks.add(task)
            task.add_done_callback(acks.discard)
            received += 1
            if received >= n:
                done.set()

    workers = []
    for _ in range(args.workers):
        worker = Worker(url, queue, token=token, prefetch=args.prefetch)
        await worker.connect()
        workers.append((worker, asyncio.create_task(consume(worker))))
    producer = Producer(url, token=token)
    await producer.__aenter__()
    await asyncio.sleep(0.3)  # every worker's socket is attached

    async def enqueue(i: int) -> None:
        sent[i] = time.perf_counter()
        await producer.enqueue(queue, {"i": i})
        replied[i] = time.perf_counter()

    calls = []
    start = time.perf_counter()
    for i in range(n):
        await asyncio.sleep(max(0.0, start + i / args.rate - time.perf_counter()))
        calls.append(asyncio.create_task(enqueue(i)))
    try:
        await asyncio.wait_for(done.wait(), 120)
        await asyncio.gather(*calls)
        if acks:
            await asyncio.wait(list(acks), timeout=10)
    finally:
        await producer.close()
        for worker, task in workers:
            await worker.close()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    to_delivery = [got[i] - sent[i] for i in range(n)]
    to_reply = [replied[i] - sent[i] for i in range(n)]
    after = [got[i] - replied[i] for i in range(n)]
    return {
        "delivery_p50": percentile(to_delivery, 0.5) * 1000,
        "delivery_p99": percentile(to_delivery, 0.99) * 1000,
        "reply_p50": percentile(to_reply, 0.5) * 1000,
        "reply_p99": percentile(to_reply, 0.99) * 1000,
        "after_p50": percentile(after, 0.5) * 1000,
        "after_p99": percentile(after, 0.99) * 1000,
        "delivered_first": sum(1 for x in after if x < 0),
    }


async def run(args: argparse.Namespace) -> None:
    for database in args.databases.split(","):
        with ExitStack() as stack:
            target = start_gateway(stack, database.strip())
            if isinstance(target, str):
                print(f"{database}: skipped ({target})")
                continue
            token = target.headers["Authorization"].removeprefix("Bearer ")
            for round_ in range(1, args.rounds + 1):
                load = loadavg()
                row = await one_round(target.gateway.http, token, f"lp{round_}", args)
                print(
                    f"{database} round {round_} at {args.rate:,.0f}/s (load {load}): "
                    f"enqueue->delivery p50 {row['delivery_p50']:.2f} p99 "
                    f"{row['delivery_p99']:.2f} ms | enqueue->reply p50 {row['reply_p50']:.2f} "
                    f"p99 {row['reply_p99']:.2f} ms | reply->delivery p50 "
                    f"{row['after_p50']:.2f} p99 {row['after_p99']:.2f} ms, "
                    f"{row['delivered_first']:,} of {args.messages:,} delivered before the reply",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    """Run the paced rounds and print one line per round."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency_path", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=500.0, help="enqueues per second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=100)
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
