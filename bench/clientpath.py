"""Client fast-path benchmark: the ``leasecast`` client's default path, its v1 path and RabbitMQ.

    python -m bench.clientpath                        # SQLite, PostgreSQL, RabbitMQ; ~3 minutes
    python -m bench.clientpath --quick                # a smoke run, well under a minute
    python -m bench.clientpath --profile bench/results/clientpath   # plus py-spy profiles
    python -m bench.clientpath --backends sqlite,rabbitmq --messages 50000 --json out.json

Everything goes through the real Python client (``leasecast``), against one
daphne gateway process per database (as ``make run`` starts it):

- **default**: ``Producer(...)`` and ``Worker(...)`` as they come: the worker
  asks for batched deliveries (``batch`` = prefetch) and coalesces the acks
  made in one event-loop iteration into ``ack_many``; the producer coalesces
  concurrent ``enqueue`` calls into ``enqueue_many``.
- **v1**: the same code with ``batch=False``: one ``enqueue``, ``deliver``
  and ``ack`` frame per message.
- **rabbitmq**: ``bench.workqueue.rabbit_figures`` (aio-pika, durable queue,
  persistent messages, publisher confirms, one manual ack per message, the
  same prefetch), on 127.0.0.1:5672 as guest.
- **default-serial** (``--no-serial`` skips it): the default client, but each
  worker awaits each ack before it takes the next delivery (the loop of
  docs/clients.md), so no two acks share a loop iteration.

The load generator is the same for the three: one asyncio process with up to
500 unconfirmed enqueues in flight (one task per ``enqueue`` call, as
concurrent application code would make them) and ``--workers`` consumers,
each handling every delivery in its own task (record the latency, ack), as
aio-pika runs its consumer callbacks. A **cycle** is enqueue, delivery and
ack; the clock runs from the first enqueue to the last confirmed ack.

**Latency** (enqueue to delivery, from a timestamp in the body) is measured
on a separate paced run, not on the backlog of a saturating one: at
``--pace`` (default 50%) of each mode's own median cycles/s, and at the same
fraction of the slowest mode's (one rate for all, for a like-for-like p99).

Rounds rotate the modes (default, v1, rabbitmq; then v1, rabbitmq, default;
...) and each round's ratio compares neighbours; medians are reported. The
machine is shared: each measurement records the load average and the CPU
the rest of the machine used meanwhile (``/proc/stat``), the gateway's (or
RabbitMQ's ``beam.smp``) and the client's CPU time per cycle, the gateway's
store transactions per cycle, and a **ceiling**: 1,000,000 us over the larger
of the two CPU costs, the rate if each side had a core of its own.

``--profile DIR`` attaches ``py-spy record --format raw --nonblocking`` to
the gateway and to this (client) process during one more default-path
measurement and prints where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from leasecast import Producer, Worker

from bench.efficiency import summarise_raw
from bench.procstat import cpu_of, loadavg, machine_busy_seconds
from bench.workqueue import (
    LeasecastTarget,
    percentile,
    rabbit_figures,
    rabbit_unavailable,
    start_gateway,
)
from tests.integration import harness

MODES = ("default", "v1", "rabbitmq", "default-serial")
WINDOW = 500  # unconfirmed enqueues in flight, as bench.workqueue


def rabbit_pids() -> list[int]:
    """The RabbitMQ server's processes (``beam.smp``), to count its CPU; may be empty."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "beam.smp":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


@dataclass
class Sample:
    """One saturating measurement of one mode."""

    backend: str
    mode: str
    round: int
    cycles: int
    seconds: float
    server_cpu_s: float  # the gateway process (or RabbitMQ's beam.smp)
    client_cpu_s: float  # this process: producer and workers
    others_cpu_s: float  # the rest of the machine meanwhile
    loadavg: str
    store_txns: int = 0  # the gateway's store transactions (group commits) meanwhile

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.seconds

    def row(self) -> dict[str, Any]:
        return asdict(self) | {
            "cycles_per_s": self.cycles_per_s,
            "server_us_per_cycle": self.server_cpu_s / self.cycles * 1e6,
            "client_us_per_cycle": self.client_cpu_s / self.cycles * 1e6,
            "others_busy": self.others_cpu_s / self.seconds,
            "store_txns_per_cycle": self.store_txns / self.cycles,
        }


@dataclass
class Paced:
    """Enqueue-to-delivery latencies of one paced run."""

    backend: str
    mode: str
    rate: float
    which: str  # "own" (fraction of this mode's max) or "common" (of the slowest mode's)
    latencies: list[float]
    loadavg: str


# -- the client's paths -------------------------------------------------------


class ClientTarget:
    """A gateway driven through the ``leasecast`` client."""

    def __init__(self, target: LeasecastTarget) -> None:
        self.target = target
        self.url = target.gateway.http
        self.token = target.headers["Authorization"].removeprefix("Bearer ")
        assert target.gateway.proc is not None
        self.pid = target.gateway.proc.pid
        self.runs = 0

    async def store_txns(self) -> int:
        """The gateway's store transactions so far (``/api/stats``)."""
        status, stats = await harness.ahttp("GET", f"{self.url}/api/stats", self.token)
        return int(stats["process"]["store_batches"]) if status == 200 else 0

    async def cycles(
        self,
        n: int,
        workers: int,
        prefetch: int,
        *,
        batch: bool,
        pace: float = 0,
        latencies: list[float] | None = None,
        serial: bool = False,
    ) -> float:
        """``n`` cycles through Producer and Worker; seconds to the last confirmed ack.

        ``pace`` > 0 enqueues at that many messages/s instead of as fast as
        the window allows. ``serial``: each worker awaits each ack before it
        takes the next delivery (the loop of docs/clients.md), instead of
        acking in a task per delivery.
        """
        self.runs += 1
        queue = f"cp{self.runs}x{int(time.time() * 1000)}{'b' if batch else 'v'}"
        done = asyncio.Event()
        acked = 0
        handlers: set[asyncio.Task[None]] = set()
        failures: list[Exception] = []
        consumers = [
            Worker(self.url, queue, token=self.token, prefetch=prefetch, batch=batch)
            for _ in range(workers)
        ]

        async def handle(delivery: Any) -> None:
            nonlocal acked
            try:
                await delivery.ack()
            except Exception as exc:  # reported after the run
                failures.append(exc)
                done.set()
                return
            acked += 1
            if acked >= n:
                done.set()

        async def consume(worker: Worker) -> None:
            async for delivery in worker:
                if latencies is not None:
                    latencies.append(time.time() - delivery.body["t"])
                if serial:
                    await handle(delivery)
                    continue
                task = asyncio.create_task(handle(delivery))
                handlers.add(task)
                task.add_done_callback(handlers.discard)

        for worker in consumers:
            await worker.connect()
        loops = [asyncio.create_task(consume(worker)) for worker in consumers]
        producer = Producer(self.url, token=self.token, batch=batch)
        await producer.__aenter__()
        window = asyncio.Semaphore(WINDOW)

        async def enqueue() -> None:
            try:
                await producer.enqueue(queue, {"t": time.time()})
            except Exception as exc:  # reported after the run
                failures.append(exc)
                done.set()
            finally:
                window.release()

        pending: set[asyncio.Task[None]] = set()
        start = time.perf_counter()
        for i in range(n):
            await window.acquire()
            if pace:
                await asyncio.sleep(max(0.0, start + i / pace - time.perf_counter()))
            task = asyncio.create_task(enqueue())
            pending.add(task)
            task.add_done_callback(pending.discard)
        await done.wait()
        seconds = time.perf_counter() - start
        await asyncio.gather(*pending)
        await producer.close()
        for worker in consumers:
            await worker.close()
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if failures:
            raise RuntimeError(f"{len(failures)} calls failed, first: {failures[0]!r}")
        return seconds


async def measure(
    mode: str,
    target: ClientTarget | None,
    backend: str,
    n: int,
    workers: int,
    prefetch: int,
    round_: int,
) -> Sample:
    """One saturating run of ``mode``, with the CPU each side used."""
    await asyncio.sleep(0.2)  # the previous run's sockets closed
    server_pids = rabbit_pids() if mode == "rabbitmq" or target is None else [target.pid]
    load = loadavg()
    gateway = target if mode != "rabbitmq" and target is not None else None
    txns0 = await gateway.store_txns() if gateway else 0
    server0 = cpu_of(server_pids)
    client0 = time.process_time()
    busy0 = machine_busy_seconds()
    if mode == "rabbitmq":
        # rabbit_figures starts its clock once its consumers are set up; the
        # CPU counters here include that set-up (a few ms against seconds).
        result = await rabbit_figures(n, workers, prefetch, False, enqueue=False, latency_count=0)
        seconds = n / result.cycles_per_s
    else:
        assert target is not None
        seconds = await target.cycles(
            n, workers, prefetch, batch=mode != "v1", serial=mode == "default-serial"
        )
    server = cpu_of(server_pids) - server0
    client = time.process_time() - client0
    others = max(0.0, machine_busy_seconds() - busy0 - server - client)
    txns = await gateway.store_txns() - txns0 if gateway else 0
    return Sample(backend, mode, round_, n, seconds, server, client, others, load, txns)


async def paced(
    mode: str,
    target: ClientTarget | None,
    backend: str,
    count: int,
    workers: int,
    prefetch: int,
    rate: float,
    which: str,
) -> Paced:
    """Enqueue-to-delivery latencies of ``count`` messages enqueued at ``rate``/s."""
    await asyncio.sleep(0.2)
    load = loadavg()
    latencies: list[float] = []
    if mode == "rabbitmq":
        result = await rabbit_figures(
            min(count, 1000),
            workers,
            prefetch,
            False,
            enqueue=False,
            latency_rate=rate,
            latency_count=count,
        )
        # rabbit_figures keeps only the percentiles: two points stand for the run.
        latencies = [result.latency_p50_ms / 1000, result.latency_p99_ms / 1000]
    else:
        assert target is not None
        await target.cycles(
            count, workers, prefetch, batch=mode == "default", pace=rate, latencies=latencies
        )
    return Paced(backend, mode, rate, which, latencies, load)


# -- profiles -----------------------------------------------------------------


def client_components(path: Path) -> list[tuple[str, float]]:
    """Self time per top-level package (or file) of a py-spy raw profile of the client."""
    counts: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        where = leaf.partition(" (")[2].rsplit(":", 1)[0]
        parts = where.split("/")
        # site-packages paths start with the package; the standard library's with a file.
        name = parts[0] if len(parts) > 1 else where
        if "/leasecast/" in where or name == "leasecast":
            name = "leasecast/" + parts[-1]
        counts[name] += int(count_text)
        total += int(count_text)
    return [(k, c / total) for k, c in counts.most_common(15)] if total else []


async def profiled(
    target: ClientTarget, out: Path, n: int, workers: int, prefetch: int, rate: int
) -> dict[str, Any]:
    """One default-path measurement with py-spy on the gateway and on this process."""
    out.mkdir(parents=True, exist_ok=True)
    raws = {"gateway": out / "gateway.txt", "client": out / "client.txt"}
    pids = {"gateway": target.pid, "client": os.getpid()}
    spies = [
        subprocess.Popen(
            [
                *("py-spy", "record", "--pid", str(pids[who]), "--format", "raw"),
                *("--rate", str(rate), "--nonblocking", "--output", str(raws[who])),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for who in ("gateway", "client")
    ]
    try:
        await asyncio.sleep(1.0)  # py-spy attached
        sample = await measure("default", target, "profiled", n, workers, prefetch, -1)
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(30)
    gateway = summarise_raw(raws["gateway"]) if raws["gateway"].exists() else {}
    client = client_components(raws["client"]) if raws["client"].exists() else []
    client_frames = summarise_raw(raws["client"])["frames"] if raws["client"].exists() else []
    return {
        "sample": sample.row(),
        "gateway": gateway,
        "client_components": client,
        "client_frames": client_frames,
        "raw": {k: str(v) for k, v in raws.items()},
    }


# -- the run ------------------------------------------------------------------


def rotated(round_: int, modes: list[str]) -> list[str]:
    """Round 1 runs the modes in order, round 2 from the second one, and so on."""
    k = (round_ - 1) % len(modes)
    return modes[k:] + modes[:k]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    samples: list[Sample] = []
    latencies: list[Paced] = []
    skipped: dict[str, str] = {}
    profile: dict[str, Any] = {}
    rabbit = "rabbitmq" in args.backends
    if rabbit and (reason := rabbit_unavailable()):
        skipped["rabbitmq"] = reason
        rabbit = False
    modes = ["default", "v1"] + (["rabbitmq"] if rabbit else [])
    if args.serial:
        modes.append("default-serial")
    # The serial loop's latency at a low rate is the default path's: not paced again.
    paced_modes = [m for m in modes if m != "default-serial"]
    stack = ExitStack()
    try:
        for backend in [b for b in args.backends if b != "rabbitmq"]:
            print(f"== {backend}", file=sys.stderr, flush=True)
            started = start_gateway(stack, backend, server="daphne")
            if isinstance(started, str):
                skipped[backend] = started
                print(f"   skipped: {started}", file=sys.stderr, flush=True)
                continue
            target = ClientTarget(started)
            try:
                profile = await backend_run(
                    args, backend, target, modes, paced_modes, samples, latencies, profile
                )
            except Exception as exc:  # a shared database restarted under us, say
                # Keep what was measured; say why the rest is missing.
                skipped[backend] = f"failed mid-run: {exc!r}"
                print(f"   {skipped[backend]}", file=sys.stderr, flush=True)
            started.gateway.stop()
    finally:
        try:
            stack.close()
        except Exception as exc:  # a database's teardown failing must not lose the figures
            skipped["cleanup"] = repr(exc)
    return {
        "samples": [s.row() for s in samples],
        "latencies": [asdict(p) for p in latencies],
        "skipped": skipped,
        "profile": profile,
    }


async def backend_run(
    args: argparse.Namespace,
    backend: str,
    target: ClientTarget,
    modes: list[str],
    paced_modes: list[str],
    samples: list[Sample],
    latencies: list[Paced],
    profile: dict[str, Any],
) -> dict[str, Any]:
    """The rounds, the paced runs and (once) the profile on one gateway; appends as it goes."""
    print("   warming up", file=sys.stderr, flush=True)
    for mode in modes:
        await measure(mode, target, backend, max(500, args.messages // 10), 2, 10, 0)
    for round_ in range(1, args.rounds + 1):
        for mode in rotated(round_, modes):
            sample = await measure(
                mode, target, backend, args.messages, args.workers, args.prefetch, round_
            )
            samples.append(sample)
            print(
                f"   round {round_} {mode}: {sample.cycles_per_s:,.0f} cycles/s, "
                f"server {sample.row()['server_us_per_cycle']:.0f} us/cycle, "
                f"client {sample.row()['client_us_per_cycle']:.0f} us/cycle, "
                f"others {sample.others_cpu_s / sample.seconds:.0%}, "
                f"load {sample.loadavg}",
                file=sys.stderr,
                flush=True,
            )
    medians = {
        mode: statistics.median(
            s.cycles_per_s for s in samples if s.backend == backend and s.mode == mode
        )
        for mode in modes
    }
    common = args.pace * min(medians[m] for m in paced_modes)
    for round_ in range(1, args.latency_rounds + 1):
        for mode in rotated(round_, paced_modes):
            for which, rate in (("own", args.pace * medians[mode]), ("common", common)):
                p = await paced(
                    mode,
                    target,
                    backend,
                    args.latency_messages,
                    args.workers,
                    args.prefetch,
                    rate,
                    which,
                )
                latencies.append(p)
                # RabbitMQ's run keeps only its p50 and p99 (see paced()).
                p50, p99 = (
                    p.latencies
                    if mode == "rabbitmq"
                    else [percentile(p.latencies, q) for q in (0.5, 0.99)]
                )
                print(
                    f"   latency {mode} at {rate:,.0f}/s ({which}): "
                    f"p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms, load {p.loadavg}",
                    file=sys.stderr,
                    flush=True,
                )
    if args.profile and not profile:
        print("   profiling the default path", file=sys.stderr, flush=True)
        profile = await profiled(
            target, args.profile, args.messages, args.workers, args.prefetch, args.rate
        )
        profile["backend"] = backend
    return profile


def latency_summary(rows: list[dict[str, Any]], backend: str, mode: str, which: str) -> str:
    """``rate: p50 / p99 ms`` over the paced runs of one kind (pooled; RabbitMQ: medians)."""
    mine = [
        r for r in rows if r["backend"] == backend and r["mode"] == mode and r["which"] == which
    ]
    if not mine:
        return "-"
    rate = statistics.median(r["rate"] for r in mine)
    if mode == "rabbitmq":  # percentiles per run only: the median of each
        p50 = statistics.median(r["latencies"][0] for r in mine)
        p99 = statistics.median(r["latencies"][1] for r in mine)
    else:
        pooled = [x for r in mine for x in r["latencies"]]
        p50, p99 = percentile(pooled, 0.5), percentile(pooled, 0.99)
    return f"{rate:,.0f}/s: {p50 * 1000:.1f} / {p99 * 1000:.1f}"


def table(data: dict[str, Any]) -> str:
    """Markdown: medians per backend and mode, the ratio to RabbitMQ, the latencies, the verdict."""
    med = statistics.median
    rows = data["samples"]
    lines = [
        "| backend | mode | cycles/s (median) | min-max | vs RabbitMQ (per round) "
        "| server us/cycle | client us/cycle | ceiling | store txns/cycle | others busy "
        "| load (1 min) "
        "| p50 / p99 ms at 50% of own max | p50 / p99 ms at a common rate |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    verdicts = []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        for mode in MODES:
            mine = [r for r in rows if r["backend"] == backend and r["mode"] == mode]
            if not mine:
                continue
            rates = [r["cycles_per_s"] for r in mine]
            ratios = []
            for r in mine:
                base = [
                    x
                    for x in rows
                    if x["backend"] == backend
                    and x["mode"] == "rabbitmq"
                    and x["round"] == r["round"]
                ]
                if base and mode != "rabbitmq":
                    ratios.append(r["cycles_per_s"] / base[0]["cycles_per_s"])
            ratio = (
                f"{med(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})" if ratios else "-"
            )
            loads = sorted(float(r["loadavg"].split()[0]) for r in mine)
            # A core each for server and client: the slower side's CPU per cycle bounds it.
            slower = max(
                med(r["server_us_per_cycle"] for r in mine),
                med(r["client_us_per_cycle"] for r in mine),
            )
            ceiling = f"{1e6 / slower:,.0f}" if slower else "-"
            lines.append(
                f"| {backend} | {mode} | {med(rates):,.0f} | {min(rates):,.0f}-{max(rates):,.0f} "
                f"| {ratio} | {med(r['server_us_per_cycle'] for r in mine):.0f} "
                f"| {med(r['client_us_per_cycle'] for r in mine):.0f} | {ceiling} "
                f"| {med(r['store_txns_per_cycle'] for r in mine):.3f} "
                f"| {med(r['others_busy'] for r in mine):.0%} "
                f"| {loads[0]:.1f}-{loads[-1]:.1f} "
                f"| {latency_summary(data['latencies'], backend, mode, 'own')} "
                f"| {latency_summary(data['latencies'], backend, mode, 'common')} |"
            )
            if mode == "default":
                fast = med(rates) >= 10_000
                three = bool(ratios) and med(ratios) >= 3
                # CPU per cycle (server + client) does not depend on who else used the cores.
                rabbit = [x for x in rows if x["backend"] == backend and x["mode"] == "rabbitmq"]
                cpu = ""
                if rabbit:
                    theirs = med(
                        x["server_us_per_cycle"] + x["client_us_per_cycle"] for x in rabbit
                    )
                    ours = med(r["server_us_per_cycle"] + r["client_us_per_cycle"] for r in mine)
                    cpu = f", {theirs / ours:.2f}x less CPU per cycle than RabbitMQ"
                    if backend == "postgres":
                        cpu += " (PostgreSQL's own CPU not counted)"
                verdicts.append(
                    f"{backend}: default path {med(rates):,.0f} cycles/s "
                    f"({'met' if fast else 'missed'} 10,000), "
                    + (
                        f"{med(ratios):.2f}x RabbitMQ ({'met' if three else 'missed'} 3x)"
                        if ratios
                        else "no RabbitMQ in this run"
                    )
                    + cpu
                )
    return "\n".join(lines) + "\n\nTarget: " + "; ".join(verdicts)


def profile_text(profile: dict[str, Any]) -> str:
    """The profiled run's figures, the gateway's components and the client's packages."""
    s = profile["sample"]
    lines = [
        f"\nProfiled default-path run ({profile['backend']}): {s['cycles_per_s']:,.0f} cycles/s "
        f"under py-spy, gateway {s['server_us_per_cycle']:.0f} us/cycle, "
        f"client {s['client_us_per_cycle']:.0f} us/cycle; raw: {profile['raw']}",
    ]
    gateway = profile["gateway"]
    if gateway.get("samples"):
        us = s["server_us_per_cycle"]
        lines.append(f"  gateway, {gateway['samples']} samples, by component (self time):")
        lines += [
            f"    {share:5.1%}  ~{share * us:5.1f} us  {name}"
            for name, share in gateway["components"]
            if share >= 0.01
        ]
        lines.append("  gateway, top frames by self time:")
        lines += [f"    {share:5.1%}  {frame}" for frame, share in gateway["frames"]]
        lines.append("  gateway, the application's functions, callees included:")
        lines += [f"    {share:5.1%}  {frame}" for frame, share in gateway["inclusive"]]
    if profile["client_components"]:
        us = s["client_us_per_cycle"]
        lines.append("  client, by package (self time):")
        lines += [
            f"    {share:5.1%}  ~{share * us:5.1f} us  {name}"
            for name, share in profile["client_components"]
        ]
        lines.append("  client, top frames by self time:")
        lines += [f"    {share:5.1%}  {frame}" for frame, share in profile["client_frames"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.clientpath", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=20_000, help="cycles per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--backends", default="sqlite,postgres,rabbitmq")
    parser.add_argument(
        "--pace", type=float, default=0.5, help="latency runs' rate, a fraction of the max"
    )
    parser.add_argument("--latency-messages", type=int, default=3000)
    parser.add_argument("--latency-rounds", type=int, default=2)
    parser.add_argument(
        "--no-serial",
        dest="serial",
        action="store_false",
        help="skip default-serial (each worker awaits each ack in its loop)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="2,000 messages, 1 round, 500 for latency"
    )
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles go here")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.quick:
        args.messages, args.rounds = 2_000, 1
        args.latency_messages, args.latency_rounds = 500, 1
    started = time.time()
    load_before = loadavg()
    data = asyncio.run(run(args))
    shape = (
        f"{args.messages:,} cycles a measurement, {args.workers} workers, "
        f"prefetch {args.prefetch}, {args.rounds} rounds, one daphne gateway"
    )
    print(f"\nClient fast path, {shape}:\n")
    if data["samples"]:
        print(table(data))
    if data["profile"]:
        print(profile_text(data["profile"]))
    for backend, reason in data["skipped"].items():
        print(f"\nskipped {backend}: {reason}")
    print(
        f"\nload average before {load_before}, after {loadavg()} "
        f"({os.cpu_count()} cores); {time.time() - started:.0f} s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json), "profile": str(args.profile)}}
                | data,
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
