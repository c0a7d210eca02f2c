"""Before and after in one run: a gateway of an earlier commit beside this tree's, with the peers.

    python -m bench.latency_ab --before 2baa93c            # SQLite and PostgreSQL, 4 rounds
    python -m bench.latency_ab --before HEAD~3 --databases sqlite --rounds 2
    python -m bench.latency_ab --before HEAD~1 --databases postgres --peers pgqueuer

The earlier commit is checked out with ``git archive`` into a temporary
directory and its gateway started from there (this tree's migrations and
client; only the server's code differs). Each round measures every system in
alternation with :mod:`bench.headline`'s own code and sizes: a saturating
work-queue run (``--cycles``, 4 producers x 500 unconfirmed, 4 workers x
prefetch 100) and a paced latency run (``--latency-messages`` at
``--latency-rate``, one producer) for ``before-DB``, ``after-DB`` and the
``--peers`` (NATS JetStream and RabbitMQ by default; pgqueuer and
pgqueuer-batched on the same PostgreSQL server on request; skipped when
their servers do not answer). Prints one Markdown row per system: p50 and
p99 (median over rounds, range), cycles/s (median, range), the server's
and PostgreSQL's CPU per cycle (medians, from ``/proc``), and with
pgqueuer, each system's cycles/s over pgqueuer's of the same round; the
JSON keeps every measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import tests.support.gateways as gateways
from bench.headline import measure_cycles, measure_latency, postmaster_pid, rotated
from bench.peers import nats_js
from bench.peers.base import QueuePeer
from bench.peers.leasecast import LeasecastQueue
from bench.peers.pgq import PgQueuerQueue, postgres_unavailable
from bench.peers.rabbit import RabbitQueue, rabbit_unavailable
from bench.workqueue import LeasecastTarget
from tests.support.databases import ROOT, postgres_database, sqlite_database


@contextmanager
def _root(path: Path) -> Any:
    """Start gateway processes from ``path`` instead of this tree."""
    # GatewayProcess starts the server in tests.support.gateways' ROOT.
    module = vars(gateways)
    saved = module["ROOT"]
    module["ROOT"] = path
    try:
        yield
    finally:
        module["ROOT"] = saved


def start(stack: ExitStack, database: str, root: Path, label: str) -> LeasecastQueue:
    """A daphne gateway of the tree at ``root`` on a fresh ``database``, as a peer."""
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-ab-{database}-{label}-"))
    env = stack.enter_context(
        postgres_database(var) if database == "postgres" else sqlite_database(var)
    )
    gateway = gateways.GatewayProcess(env, var, name=f"ab-{label}", server="daphne")
    with _root(root):
        gateway.start()
    stack.callback(gateway.stop)
    token = gateway.issue_token("admin", name="ab")
    peer = LeasecastQueue(
        LeasecastTarget(f"leasecast-{database}", gateway, token), batch=True, database=database
    )
    peer.name = f"{label}-{database}"
    return peer


def checkout(stack: ExitStack, commit: str) -> Path:
    """``commit``'s files in a temporary directory (removed at the end)."""
    where = Path(tempfile.mkdtemp(prefix="leasecast-ab-tree-"))
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    stack.callback(subprocess.run, ["rm", "-rf", str(where)], check=False)
    return where


async def run(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {"cycles": [], "latency": []}
    postmaster = postmaster_pid()
    with ExitStack() as stack:
        before = checkout(stack, args.before)
        peers: list[tuple[QueuePeer, bool]] = []
        for database in args.databases.split(","):
            for label, root in (("before", before), ("after", ROOT)):
                peers.append((start(stack, database, root, label), database == "postgres"))
        wanted = set(args.peers.split(",")) if args.peers else set()
        if "nats-jetstream" in wanted and not nats_js.unavailable():
            peers.append((nats_js.JetStreamQueue(), False))
        if "rabbitmq" in wanted and not rabbit_unavailable():
            peers.append((RabbitQueue(), False))
        for batch in (False, True):
            name = "pgqueuer" + ("-batched" if batch else "")
            if name in wanted and not postgres_unavailable():
                peers.append((PgQueuerQueue(batch=batch), False))
        for peer, _ in peers:
            await peer.start()
        try:
            for round_ in range(1, args.rounds + 1):
                for peer, postgres in rotated(round_, peers):
                    row = await measure_cycles(peer, postgres, postmaster, args, round_)
                    rows["cycles"].append(row)
                    print(
                        f"round {round_} {peer.name}: {row['cycles_per_s']:,.0f} cycles/s "
                        f"(load {row['loadavg']})",
                        file=sys.stderr,
                        flush=True,
                    )
                for peer, _ in rotated(round_, peers):
                    row = await measure_latency(peer, args, round_)
                    rows["latency"].append(row)
                    print(
                        f"round {round_} {peer.name}: p50 {row['p50_ms']:.2f} ms, "
                        f"p99 {row['p99_ms']:.2f} ms (load {row['loadavg']})",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for peer, _ in peers:
                await peer.close()
    return rows


def table(rows: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: latency and cycles/s per system, median and range over the rounds."""

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        return (
            f"{format(statistics.median(values), fmt)} "
            f"({format(min(values), fmt)}-{format(max(values), fmt)})"
        )

    def median(values: list[float | None], fmt: str) -> str:
        known = [v for v in values if v is not None]
        return format(statistics.median(known), fmt) if known else "n/a"

    base = {r["round"]: r["cycles_per_s"] for r in rows["cycles"] if r["system"] == "pgqueuer"}
    lines = [
        "| system | p50 ms (range) | p99 ms (range) | cycles/s (range) "
        "| server CPU us/cycle | PostgreSQL CPU us/cycle | vs pgqueuer (per round) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    names = dict.fromkeys(r["system"] for r in rows["cycles"] + rows["latency"])
    for name in names:
        latency = [r for r in rows["latency"] if r["system"] == name]
        mine = [r for r in rows["cycles"] if r["system"] == name]
        ratios = [r["cycles_per_s"] / base[r["round"]] for r in mine if r["round"] in base]
        versus = (
            f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
            if ratios
            else "-"
        )
        lines.append(
            f"| {name} | {spread([r['p50_ms'] for r in latency], '.2f')} "
            f"| {spread([r['p99_ms'] for r in latency], '.1f')} "
            f"| {spread([r['cycles_per_s'] for r in mine], ',.0f')} "
            f"| {median([r['server_us_per_cycle'] for r in mine], '.0f')} "
            f"| {median([r['database_us_per_cycle'] for r in mine], '.0f')} | {versus} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the rounds, print the table, keep the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.latency_ab", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--before", required=True, help="the earlier commit (git rev)")
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--latency-messages", type=int, default=2_000)
    parser.add_argument("--latency-rate", type=float, default=500.0)
    parser.add_argument(
        "--peers",
        default="nats-jetstream,rabbitmq",
        help="comma-separated, of: nats-jetstream, rabbitmq, pgqueuer, pgqueuer-batched",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "bench/results/latency_ab.json")
    args = parser.parse_args(argv)
    # bench.headline's workload, as its full run has it.
    args.producers, args.window, args.workers, args.prefetch = 4, 500, 4, 100
    rows = asyncio.run(run(args))
    print(table(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
