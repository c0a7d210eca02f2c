"""One gateway process against two behind haproxy: v1 work-queue throughput, in one run.

    python -m bench.balancer                        # 20,000 cycles, 3 rounds, daphne
    python -m bench.balancer --server uvicorn --messages 5000 --rounds 1

The deployment of tests/integration/test_balancer.py: gateways on one fresh
PostgreSQL database and one Redis, haproxy from a generated config
(``tests.integration.harness.Balancer``). Three setups, measured in rotation
in each round so that the machine's other load falls on all of them alike:

- **1 direct**: the clients connect to process A itself;
- **1 via haproxy**: haproxy in front of A alone (what the proxy costs);
- **2 via haproxy**: haproxy in front of A and B (``balance leastconn``).

A measurement is the v1 cycle of bench/workqueue.py (``enqueue``,
``enqueued``, ``deliver``, ``ack``, ``acked``) with ``--producers`` sockets
pipelining enqueues and ``--workers`` sockets acking each delivery, all
through the setup's address; cycles/s runs from the first enqueue to the last
confirmed ack. Beside it: how busy the whole machine was (from
``/proc/stat``; 100% is every core) and the CPU seconds per 1,000 cycles
spent by the gateways, haproxy, PostgreSQL and the load generator, so that a
figure can be read as "the machine was full" or not.

Needs PostgreSQL, Redis and haproxy (``make balancer``); says which is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench.procstat import cpu_of, machine_busy_seconds
from bench.workqueue import LeasecastTarget
from tests.support.databases import postgres_database, postgres_unavailable, redis_unavailable
from tests.support.gateways import Balancer, GatewayProcess, haproxy_unavailable

SETUPS = ("1 direct", "1 via haproxy", "2 via haproxy")


class UrlTarget(LeasecastTarget):
    """bench/workqueue.py's load generator, aimed at any address (haproxy or a process)."""

    def __init__(self, name: str, ws_url: str, token: str) -> None:
        self.name = name
        self.ws_url = ws_url
        self.headers = {"Authorization": f"Bearer {token}"}

    async def socket(self, path: str) -> ClientConnection:
        return await connect(self.ws_url + path, additional_headers=self.headers, max_size=None)


def postgres_pids() -> list[int]:
    """The PostgreSQL server's processes on this machine (backends included)."""
    done = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()]


@dataclass
class Sample:
    """One measurement of one setup."""

    setup: str
    round: int
    cycles: int
    seconds: float
    machine_busy: float  # share of all cores busy meanwhile, 0..1
    cpu_s: dict[str, float] = field(default_factory=dict)  # by process group

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.seconds


async def measure(
    target: UrlTarget, n: int, producers: int, workers: int, prefetch: int
) -> tuple[float, float]:
    """Seconds for ``n`` v1 cycles, and the seconds until the last enqueue was confirmed."""
    queue = f"bal{uuid.uuid4().hex[:10]}"
    latencies: list[float] = []
    done = asyncio.Event()
    consumer = asyncio.create_task(
        target.consume(queue, n, workers, prefetch, batched=False, latencies=latencies, done=done)
    )
    await asyncio.sleep(0.5)  # every worker connected and waiting
    start = time.perf_counter()
    shares = [n // producers + (1 if k < n % producers else 0) for k in range(producers)]
    enqueue_seconds = await asyncio.gather(
        *(target.produce(queue, share, batched=False) for share in shares)
    )
    await done.wait()
    seconds = time.perf_counter() - start
    await consumer
    return seconds, max(enqueue_seconds)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    for reason in (postgres_unavailable(), redis_unavailable(), haproxy_unavailable()):
        if reason:
            raise SystemExit(f"bench.balancer needs it: {reason}")
    samples: list[Sample] = []
    with ExitStack() as stack:
        var = Path(tempfile.mkdtemp(prefix="leasecast-bench-balancer-"))
        env = stack.enter_context(postgres_database(var))
        env.update(REDIS_URL=args.redis, GATEWAY_REDIS_PREFIX=f"lcbb{uuid.uuid4().hex[:8]}")
        a = GatewayProcess(env, var, name="a", server=args.server)
        b = GatewayProcess(env, var, name="b", server=args.server)
        for gw in (a, b):
            gw.start()
            stack.callback(gw.stop)
        one = Balancer([a], var, name="lb1", check_ms=1000)
        two = Balancer([a, b], var, name="lb2", check_ms=1000)
        for lb in (one, two):
            lb.start()
            stack.callback(lb.stop)
        token = a.issue_token("admin", name="bench")
        targets = {
            "1 direct": UrlTarget("1 direct", a.ws, token),
            "1 via haproxy": UrlTarget("1 via haproxy", one.ws, token),
            "2 via haproxy": UrlTarget("2 via haproxy", two.ws, token),
        }
        groups: dict[str, Callable[[], list[int]]] = {
            "gateways": lambda: [p.proc.pid for p in (a, b) if p.proc is not None],
            "haproxy": lambda: [lb.proc.pid for lb in (one, two) if lb.proc is not None],
            "postgres": postgres_pids,
            "client": lambda: [os.getpid()],
        }
        # A warm-up per setup: connections, caches, JIT-free but not cold.
        for target in targets.values():
            await measure(target, min(2000, args.messages), args.producers, args.workers, 100)
        for round_ in range(1, args.rounds + 1):
            order = list(SETUPS) if round_ % 2 else list(reversed(SETUPS))
            for setup in order:
                pids = {name: pids() for name, pids in groups.items()}
                cpu0 = {name: cpu_of(p, children=True) for name, p in pids.items()}
                busy0, wall0 = machine_busy_seconds(), time.monotonic()
                seconds, _ = await measure(
                    targets[setup], args.messages, args.producers, args.workers, args.prefetch
                )
                cores = os.cpu_count() or 1
                busy = (machine_busy_seconds() - busy0) / ((time.monotonic() - wall0) * cores)
                cpu = {name: cpu_of(p, children=True) - cpu0[name] for name, p in pids.items()}
                sample = Sample(setup, round_, args.messages, seconds, busy, cpu)
                samples.append(sample)
                print(
                    f"   round {round_} {setup}: {sample.cycles_per_s:,.0f} cycles/s, "
                    f"machine {busy:.0%} busy",
                    file=sys.stderr,
                    flush=True,
                )
    return {"samples": [asdict(s) | {"cycles_per_s": s.cycles_per_s} for s in samples]}


def table(samples: list[dict[str, Any]]) -> str:
    """Median cycles/s per setup, its ratio to 1 direct, and CPU per 1,000 cycles."""
    rows = [
        "| setup | cycles/s (median) | range | vs 1 direct | machine busy "
        "| CPU s per 1,000 cycles: gateways / haproxy / PostgreSQL / client |",
        "|---|---|---|---|---|---|",
    ]
    medians = {
        setup: statistics.median(s["cycles_per_s"] for s in samples if s["setup"] == setup)
        for setup in SETUPS
    }
    for setup in SETUPS:
        mine = [s for s in samples if s["setup"] == setup]
        rates = [s["cycles_per_s"] for s in mine]
        busy = statistics.median(s["machine_busy"] for s in mine)
        per_k = {
            name: statistics.median(s["cpu_s"][name] / s["cycles"] * 1000 for s in mine)
            for name in ("gateways", "haproxy", "postgres", "client")
        }
        rows.append(
            f"| {setup} | {medians[setup]:,.0f} | {min(rates):,.0f}-{max(rates):,.0f} "
            f"| {medians[setup] / medians['1 direct']:.2f}x | {busy:.0%} "
            f"| {per_k['gateways']:.2f} / {per_k['haproxy']:.2f} / {per_k['postgres']:.2f} "
            f"/ {per_k['client']:.2f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.balancer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=20_000, help="cycles per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--server", choices=("daphne", "uvicorn"), default="daphne")
    parser.add_argument(
        "--redis", default=os.environ.get("LEASECAST_TEST_REDIS", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    started = time.time()
    data = asyncio.run(run(args))
    shape = (
        f"{args.messages:,} v1 cycles, {args.producers} producers, {args.workers} workers, "
        f"prefetch {args.prefetch}, {args.server}, PostgreSQL + Redis, {os.cpu_count()} cores"
    )
    print(f"\nOne process against two behind haproxy, {shape}:\n")
    print(table(data["samples"]))
    print(f"\n({time.time() - started:.0f} s, load average {os.getloadavg()[0]:.1f})")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, **data}))


if __name__ == "__main__":
    main()
