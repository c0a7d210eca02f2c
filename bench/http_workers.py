"""HTTP workers against socket workers: drain throughput of one queue, in one run.

    python -m bench.http_workers                               # SQLite and PostgreSQL
    python -m bench.http_workers --backends sqlite --messages 2000   # a smoke run
    python -m bench.http_workers --json out.json               # also write the figures

On one gateway (daphne, as ``bench.workqueue`` starts it) per backend,
``--messages`` messages are enqueued up front (``enqueue_many`` of 100), then
drained by ``--workers`` workers in each mode in turn (the socket mode first
and last, against drift on a shared machine); drain/s = messages / time from
the first worker starting to the last ack confirmed:

- ``socket``: worker sockets with ``prefetch`` = ``--batch``, batched
  deliveries and ``ack_many`` (the Python client's default path);
- ``http N``: ``leasecast.HttpWorker`` in a thread each (the standard
  library's ``urllib``: one connection per request, as the client makes
  them), each loop one ``lease`` of up to N messages (``wait`` 1 s) and one
  ``ack`` of all of them: two requests per N messages.

A cycle is one message leased and acked. The gateway's CPU per message is
its process's CPU time over the drain divided by the messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

from leasecast import HttpWorker

from bench.procstat import process_cpu_seconds
from bench.queue_v11 import drain, gateway_pid, token_of
from bench.workqueue import LeasecastTarget, start_gateway


@dataclass
class Row:
    """One drain."""

    backend: str
    mode: str
    messages: int
    drain_per_s: float = 0.0
    vs_socket: float = 0.0  # against the mean of the two socket drains
    gateway_cpu_us: float = 0.0  # gateway CPU per message, microseconds
    requests: int = 0  # HTTP requests made (0 for sockets)


def http_drain(
    target: LeasecastTarget, queue: str, n: int, workers: int, batch: int
) -> tuple[float, int]:
    """Drain ``n`` messages with ``workers`` HttpWorker threads; (seconds, requests)."""
    left = [n]
    requests = [0]
    finished = [0.0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        worker = HttpWorker(target.gateway.http, queue, token=token_of(target))
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                got = worker.lease(batch, wait=1.0)
                with lock:
                    requests[0] += 1
                if not got:
                    continue
                worker.ack([d.receipt for d in got])
                with lock:
                    requests[0] += 1
                    left[0] -= len(got)
                    if left[0] <= 0 and not finished[0]:
                        finished[0] = time.perf_counter()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Until the last ack: the other threads may still be in a lease's wait.
    seconds = (finished[0] or time.perf_counter()) - start
    if errors:
        raise errors[0]
    return seconds, requests[0]


async def one_drain(
    target: LeasecastTarget, backend: str, mode: str, args: argparse.Namespace
) -> Row:
    row = Row(backend, mode, args.messages)
    queue = f"pull-{mode.replace(' ', '')}-{int(time.time() * 1000)}"
    await target.produce(queue, args.messages, batched=True, fields=lambda i: {})
    pid = gateway_pid(target)
    cpu = process_cpu_seconds(pid)
    if mode == "socket":
        seconds = await drain(
            target, queue, args.messages, args.workers, args.batch, batched=True, log=[]
        )
    else:
        size = int(mode.split()[1])
        seconds, row.requests = await asyncio.to_thread(
            http_drain, target, queue, args.messages, args.workers, size
        )
    row.gateway_cpu_us = (process_cpu_seconds(pid) - cpu) / args.messages * 1e6
    row.drain_per_s = args.messages / seconds
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[Row] = []
    modes = ["socket", f"http {args.batch}", f"http {args.big_batch}", "socket"]
    with ExitStack() as stack:
        for backend in args.backends:
            target = start_gateway(stack, backend)
            if isinstance(target, str):
                print(f"{backend}: skipped ({target})", file=sys.stderr)
                continue
            mine = []
            for mode in modes:
                row = await one_drain(target, backend, mode, args)
                mine.append(row)
                print(f"   {asdict(row)}", file=sys.stderr, flush=True)
            base = [r.drain_per_s for r in mine if r.mode == "socket"]
            mean = sum(base) / len(base)
            for row in mine:
                row.vs_socket = row.drain_per_s / mean
            rows += mine
    return {"rows": [asdict(r) for r in rows], "args": vars(args)}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | workers | mode | messages | drain/s | vs socket | gateway CPU/msg "
        "| requests |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r.get('workers', '')} | {r['mode']} | {r['messages']:,} "
            f"| {r['drain_per_s']:,.0f} | {r['vs_socket']:.2f}x | {r['gateway_cpu_us']:,.0f} us "
            f"| {r['requests']:,} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=10, help="prefetch, and the small lease")
    parser.add_argument("--big-batch", type=int, default=100, help="the large lease (<= 100)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    for row in result["rows"]:
        row["workers"] = args.workers
    print(table(result["rows"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
