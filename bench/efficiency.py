"""Efficiency benchmark: v1 work-queue cycles against the same server's echo limit, in one run.

    python -m bench.efficiency                          # daphne and uvicorn, 3 rounds, ~2 minutes
    python -m bench.efficiency --profile bench/results/profiles   # plus py-spy profiles
    python -m bench.efficiency --cycles 500 --rounds 1  # a smoke run

For each ASGI server (daphne as ``make run`` starts it, uvicorn as the tests
start it) two processes run side by side:

- **gateway**: Leasecast (``gateway.asgi``) on a fresh SQLite database;
- **echo**: ``bench/echo_app.py``, a bare ASGI application answering the
  same frames with replies of the same shapes and sizes and storing nothing.

Both are driven by the same client code (``bench.workqueue.LeasecastTarget``:
one producer pipelining up to 500 unconfirmed enqueues, 4 workers with
prefetch 100 acking each delivery), in v1 frames only: a cycle is
``enqueue``, ``enqueued``, ``deliver``, ``ack``, ``acked``, five WebSocket
frames. The clock runs from the first enqueue to the last confirmed ack.

Per measurement: cycles/s; the server process's CPU time per cycle (utime +
stime of every thread, from ``/proc/PID/stat``); the server's and the
client's CPU use; and the CPU the rest of the machine used meanwhile (from
``/proc/stat``: other processes' load). Rounds rotate gateway, echo, gateway,
echo... per server, and each round's ratio compares neighbours; the median
and the spread over rounds are reported.

``--profile DIR`` then attaches ``py-spy record --format raw`` to each server
process during one more measurement and prints the top frames by self time
and the share per component (server framing, Channels, Django, gateway...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.procstat import machine_busy_seconds, process_cpu_seconds
from bench.workqueue import LeasecastTarget, start_gateway
from tests.integration import harness
from tests.support.gateways import GatewayProcess

SERVERS = ("daphne", "uvicorn")


class EchoProcess(GatewayProcess):
    """``bench/echo_app.py`` served by the same server command as the gateway."""

    def command(self) -> list[str]:
        return [
            "bench.echo_app:application" if arg == "gateway.asgi:application" else arg
            for arg in super().command()
        ]


@dataclass
class Sample:
    """One timed measurement of one application on one server."""

    server: str
    app: str
    round: int
    cycles: int
    seconds: float
    server_cpu_s: float
    client_cpu_s: float
    others_cpu_s: float
    loadavg: float
    store_batches: int = 0  # the gateway's store transactions (group commits) meanwhile
    loop_cpu_s: float = 0.0  # the server's main thread (the event loop) alone

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.seconds

    @property
    def server_us_per_cycle(self) -> float:
        return self.server_cpu_s / self.cycles * 1e6

    def row(self) -> dict[str, Any]:
        return asdict(self) | {
            "cycles_per_s": self.cycles_per_s,
            "server_us_per_cycle": self.server_us_per_cycle,
            "server_busy": self.server_cpu_s / self.seconds,
            "client_busy": self.client_cpu_s / self.seconds,
            "others_busy": self.others_cpu_s / self.seconds,
            "store_batches_per_cycle": self.store_batches / self.cycles,
            "loop_us_per_cycle": self.loop_cpu_s / self.cycles * 1e6,
        }


@dataclass
class Target:
    """A running server process and the client bound to it."""

    server: str
    app: str
    client: LeasecastTarget
    pid: int
    runs: int = field(default=0)


async def cycles(target: Target, n: int, workers: int, prefetch: int, round_: int) -> Sample:
    """``n`` v1 cycles through ``target``, timed to the last confirmed ack."""
    target.runs += 1
    queue = f"eff{target.runs}x{int(time.time() * 1000)}"
    done = asyncio.Event()
    latencies: list[float] = []
    consumer = asyncio.create_task(
        target.client.consume(
            queue, n, workers, prefetch, batched=False, latencies=latencies, done=done
        )
    )
    await asyncio.sleep(0.3)  # workers connected and waiting
    batches0 = await store_batches(target)
    server0 = process_cpu_seconds(target.pid)
    loop0 = process_cpu_seconds(target.pid, target.pid)
    client0 = time.process_time()
    busy0 = machine_busy_seconds()
    start = time.perf_counter()
    producer = asyncio.create_task(target.client.produce(queue, n, batched=False))
    await done.wait()
    seconds = time.perf_counter() - start
    server_cpu = process_cpu_seconds(target.pid) - server0
    loop_cpu = process_cpu_seconds(target.pid, target.pid) - loop0
    client_cpu = time.process_time() - client0
    others = max(0.0, machine_busy_seconds() - busy0 - server_cpu - client_cpu)
    batches = await store_batches(target) - batches0
    await producer
    await consumer
    return Sample(
        target.server,
        target.app,
        round_,
        n,
        seconds,
        server_cpu,
        client_cpu,
        others,
        os.getloadavg()[0],
        batches,
        loop_cpu,
    )


async def store_batches(target: Target) -> int:
    """The gateway's store transactions so far (``/api/stats``); 0 for the echo app."""
    if target.app != "gateway":
        return 0
    url = f"{target.client.gateway.http}/api/stats"
    token = target.client.headers["Authorization"].removeprefix("Bearer ")
    status, stats = await harness.ahttp("GET", url, token)
    return int(stats["process"]["store_batches"]) if status == 200 else 0


# -- profiles -----------------------------------------------------------------

COMPONENTS = (
    # py-spy names files relative to site-packages or the working directory.
    ("(autobahn", "daphne: autobahn (WebSocket framing)"),
    ("(click", "daphne: autobahn's debug strings (click.style)"),
    ("(txaio", "daphne: autobahn (WebSocket framing)"),
    ("(twisted", "daphne: twisted"),
    ("(daphne", "daphne: daphne"),
    ("(uvicorn", "uvicorn"),
    ("(websockets", "uvicorn: websockets (framing)"),
    ("(channels", "channels"),
    ("(asgiref", "asgiref"),
    ("(django", "django"),
    ("(consumers", "gateway: consumers/"),
    ("(gateway/store", "gateway: store/ (SQL)"),
    ("(gateway", "gateway: gateway/"),
    ("(bench", "echo app"),
    ("(concurrent/futures", "thread pool (store thread hand-off)"),
    ("(threading", "thread pool (store thread hand-off)"),
    ("(queue.py", "thread pool (store thread hand-off)"),
    ("(asyncio", "asyncio"),
    ("(selectors", "asyncio"),
    ("(<string>", "generated code (dataclass __init__)"),
)


def component(frame: str) -> str:
    """The package a py-spy frame (``function (path:line)``) belongs to."""
    for needle, name in COMPONENTS:
        if needle in frame:
            return name
    return "other: " + frame.partition(" (")[2].split(":")[0]


def summarise_raw(path: Path, top: int = 15) -> dict[str, Any]:
    """Self time per frame and per component from a py-spy ``--format raw`` file."""
    frames: Counter[str] = Counter()
    components: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()  # the project's own functions, callees included
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        leaf = stack.rsplit(";", 1)[-1]
        # "function (path/to/file.py:123)": keep the function and the file's tail.
        name, _, where = leaf.partition(" (")
        file_tail = "/".join(where.rsplit(":", 1)[0].split("/")[-2:])
        frames[f"{name} ({file_tail})"] += count
        components[component(leaf)] += count
        # Threads other than the event loop's start in threading's bootstrap.
        threads["other threads" if "_bootstrap (threading.py" in stack else "loop thread"] += count
        ours = set()
        for entry in stack.split(";"):
            function, _, place = entry.partition(" (")
            if place.startswith(("consumers/", "gateway/", "bench/")) and "serve.py" not in place:
                ours.add(f"{function} ({place.split(':')[0]})")
        for key in ours:
            inclusive[key] += count
        total += count
    return {
        "samples": total,
        "frames": [(f, c / total) for f, c in frames.most_common(top)] if total else [],
        "components": [(k, c / total) for k, c in components.most_common()] if total else [],
        "threads": [(k, c / total) for k, c in threads.most_common()] if total else [],
        "inclusive": [(k, c / total) for k, c in inclusive.most_common(top)] if total else [],
    }


def py_spy() -> str:
    """The py-spy beside this Python (the bench extra installs it there), else the PATH's."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--profile needs py-spy: install the bench extra (make bench)")
    return found


async def profiled(
    target: Target, out: Path, n: int, workers: int, prefetch: int, rate: int, gil: bool = False
) -> dict[str, Any]:
    """One measurement with py-spy recording the server; its summary."""
    raw = out / f"{target.server}-{target.app}.txt"
    spy = subprocess.Popen(
        [
            *(py_spy(), "record", "--pid", str(target.pid), "--format", "raw"),
            *("--rate", str(rate), "--nonblocking", "--output", str(raw)),
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await asyncio.sleep(1.0)  # py-spy attached
        sample = await cycles(target, n, workers, prefetch, -1)
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)
    summary = summarise_raw(raw) if raw.exists() else {"samples": 0, "frames": [], "components": []}
    return summary | {
        "server": target.server,
        "app": target.app,
        "raw": str(raw),
        "cycles_per_s_under_profiler": sample.cycles_per_s,
        "server_us_per_cycle_under_profiler": sample.server_us_per_cycle,
    }


# -- the run ------------------------------------------------------------------


def start_targets(stack: ExitStack, servers: list[str]) -> list[Target]:
    """A gateway (fresh SQLite) and an echo process for each server."""
    targets = []
    for server in servers:
        gateway = start_gateway(stack, "sqlite", server=server)
        assert not isinstance(gateway, str)
        assert gateway.gateway.proc is not None
        targets.append(Target(server, "gateway", gateway, gateway.gateway.proc.pid))
        var = Path(tempfile.mkdtemp(prefix=f"leasecast-echo-{server}-"))
        echo = EchoProcess(dict(os.environ), var, name=f"echo-{server}", server=server)
        echo.start()
        stack.callback(echo.stop)
        assert echo.proc is not None
        client = LeasecastTarget(f"echo-{server}", echo, "unused")
        targets.append(Target(server, "echo", client, echo.proc.pid))
    return targets


def ratios(samples: list[Sample], server: str) -> list[float]:
    """Per round: the gateway's cycles/s over the echo's, on ``server``."""
    out = []
    for round_ in sorted({s.round for s in samples}):
        pair = {s.app: s for s in samples if s.server == server and s.round == round_}
        if "gateway" in pair and "echo" in pair:
            out.append(pair["gateway"].cycles_per_s / pair["echo"].cycles_per_s)
    return out


def cpu_ratios(samples: list[Sample], server: str) -> list[float]:
    """Per round: the echo's server CPU per cycle over the gateway's, on ``server``.

    Unlike cycles/s this does not depend on who else used the cores: it is
    the throughput ratio a run bound by the server's CPU alone would show.
    """
    out = []
    for round_ in sorted({s.round for s in samples}):
        pair = {s.app: s for s in samples if s.server == server and s.round == round_}
        if "gateway" in pair and "echo" in pair:
            out.append(pair["echo"].server_us_per_cycle / pair["gateway"].server_us_per_cycle)
    return out


def table(samples: list[Sample], servers: list[str]) -> str:
    """Markdown: medians per server and application, then the ratio with its spread."""
    med = statistics.median
    lines = [
        "| server | app | cycles/s (median) | min-max | server CPU us/cycle "
        "| of which loop thread | server busy | client busy | others busy | store txns/cycle |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for server in servers:
        for app in ("gateway", "echo"):
            mine = [s for s in samples if s.server == server and s.app == app]
            if not mine:
                continue
            rates = [s.cycles_per_s for s in mine]
            lines.append(
                f"| {server} | {app} | {med(rates):,.0f} | {min(rates):,.0f}-{max(rates):,.0f} "
                f"| {med(s.server_us_per_cycle for s in mine):.0f} "
                f"| {med(s.loop_cpu_s / s.cycles * 1e6 for s in mine):.0f} "
                f"| {med(s.server_cpu_s / s.seconds for s in mine):.0%} "
                f"| {med(s.client_cpu_s / s.seconds for s in mine):.0%} "
                f"| {med(s.others_cpu_s / s.seconds for s in mine):.0%} "
                f"| {med(s.store_batches / s.cycles for s in mine):.2f} |"
            )
    lines += [
        "",
        "| server | gateway / echo cycles/s (median) | per round | target 60% "
        "| echo / gateway server CPU per cycle |",
        "|---|---:|---|---|---:|",
    ]
    for server in servers:
        r = ratios(samples, server)
        if r:
            verdict = "met" if med(r) >= 0.6 else f"missed by {(0.6 - med(r)) * 100:.1f} points"
            rounds = ", ".join(f"{x:.0%}" for x in r)
            cpu = med(cpu_ratios(samples, server))
            lines.append(f"| {server} | {med(r):.0%} | {rounds} | {verdict} | {cpu:.0%} |")
    return "\n".join(lines)


def profile_text(profiles: list[dict[str, Any]]) -> str:
    lines = []
    for p in profiles:
        us = p["server_us_per_cycle_under_profiler"]
        lines.append(
            f"\n{p['server']} {p['app']}: {p['samples']} busy samples, "
            f"{p['cycles_per_s_under_profiler']:,.0f} cycles/s and {us:.0f} us server CPU/cycle "
            f"under py-spy, {p['raw']}"
        )
        lines.append(
            "  by thread: " + ", ".join(f"{name} {share:.0%}" for name, share in p["threads"])
        )
        lines.append("  by component (self time; share x CPU per cycle):")
        lines += [
            f"    {share:5.1%}  ~{share * us:4.0f} us  {name}"
            for name, share in p["components"]
            if share >= 0.01
        ]
        lines.append("  top frames by self time:")
        lines += [f"    {share:5.1%}  {frame}" for frame, share in p["frames"]]
        if p.get("inclusive"):
            lines.append("  the application's functions, callees included:")
            lines += [f"    {share:5.1%}  {frame}" for frame, share in p["inclusive"]]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    samples: list[Sample] = []
    profiles: list[dict[str, Any]] = []
    with ExitStack() as stack:
        targets = start_targets(stack, args.servers)
        print("warming up", file=sys.stderr, flush=True)
        for target in targets:
            await cycles(target, max(200, args.cycles // 5), args.workers, args.prefetch, 0)
        for round_ in range(1, args.rounds + 1):
            for target in targets:  # daphne gateway, daphne echo, uvicorn gateway, ...
                sample = await cycles(target, args.cycles, args.workers, args.prefetch, round_)
                samples.append(sample)
                print(
                    f"   round {round_} {target.server} {target.app}: "
                    f"{sample.cycles_per_s:,.0f} cycles/s, "
                    f"{sample.server_us_per_cycle:.0f} us server CPU/cycle, "
                    f"others {sample.others_cpu_s / sample.seconds:.0%}",
                    file=sys.stderr,
                    flush=True,
                )
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            for target in targets:
                profiles.append(
                    await profiled(
                        target,
                        args.profile,
                        args.cycles,
                        args.workers,
                        args.prefetch,
                        args.rate,
                        args.gil,
                    )
                )
    return {"samples": [s.row() for s in samples], "profiles": profiles}


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.efficiency", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--cycles", type=int, default=20_000, help="cycles per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--profile", type=Path, help="py-spy raw profiles go here")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument(
        "--gil", action="store_true", help="py-spy samples only the thread holding the GIL"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    started = time.time()
    load_before = os.getloadavg()
    data = asyncio.run(run(args))
    samples = [
        Sample(**{k: v for k, v in row.items() if k in Sample.__dataclass_fields__})
        for row in data["samples"]
    ]
    shape = (
        f"{args.cycles:,} v1 cycles a measurement, {args.workers} workers, "
        f"prefetch {args.prefetch}, {args.rounds} rounds"
    )
    print(f"\nEfficiency, {shape}:\n")
    print(table(samples, args.servers))
    if data["profiles"]:
        print(profile_text(data["profiles"]))
    load_after = os.getloadavg()
    print(
        f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
        f"({os.cpu_count()} cores); {time.time() - started:.0f} s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json), "profile": str(args.profile)}}
                | data
                | {"load_before": load_before, "load_after": load_after},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
