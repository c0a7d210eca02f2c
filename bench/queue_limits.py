"""What queue limits cost: lease throughput with ``max_in_flight`` and ``rate_limit`` on and off.

    python -m bench.queue_limits                          # SQLite and PostgreSQL, ~5 minutes
    python -m bench.queue_limits --backends sqlite --messages 2000   # a smoke run
    python -m bench.queue_limits --json out.json          # also write the figures

On one gateway (daphne, as ``bench.workqueue`` starts it) per backend, the same
drain runs under each setting in turn, in one run, so the ratios compare like
with like on a shared machine: ``--messages`` messages enqueued up front
(``enqueue_many`` of 100), then ``--workers`` sockets with ``--prefetch``
(batched: ``?batch=PREFETCH`` and ``ack_many``) deliver and ack them all;
drain/s = messages / time from the first worker connecting to the last ack
confirmed. ``--rounds`` rounds of ``off``, ``max_in_flight``, ``rate_limit``
and ``both``, interleaved against the machine's drift, then ``binding`` and
``off`` once more; the summary compares medians. The settings:

- ``off``: no limits (the baseline);
- ``max_in_flight``: a limit that never binds (twice what the workers can
  hold), so the figure is the cost of counting: the queue row's lock and the
  count of leases in flight in every lease round;
- ``rate_limit``: 1,000,000 leases a second with a burst of 1,000,000, again
  never binding: the cost of the token bucket (lock, read, update);
- ``both``: the two at once;
- ``binding``: ``max_in_flight`` = ``--binding`` (fewer than the workers
  hold), to show the limit doing its job: in flight stays at the limit.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

from bench.procstat import process_cpu_seconds
from bench.queue_v11 import drain, gateway_pid, token_of
from bench.workqueue import LeasecastTarget, start_gateway
from tests.support.clients import ahttp

#: Settings of each run, by name (see the module's doc).
SETTINGS: dict[str, dict[str, Any]] = {
    "off": {},
    "max_in_flight": {"max_in_flight": -1},  # -1: twice what the workers hold
    "rate_limit": {"rate_limit": 1_000_000, "rate_burst": 1_000_000},
    "both": {"max_in_flight": -1, "rate_limit": 1_000_000, "rate_burst": 1_000_000},
    "binding": {"max_in_flight": -2},  # -2: --binding
}
#: One round; ``--rounds`` of them, then ``binding`` once and ``off`` again.
ROUND = ("off", "max_in_flight", "rate_limit", "both")


@dataclass
class Row:
    """One drain."""

    backend: str
    setting: str
    messages: int
    drain_per_s: float = 0.0
    vs_off: float = 0.0  # against the median of the backend's ``off`` runs
    gateway_cpu: float = 0.0  # share of one core during the drain
    most_in_flight: int = 0  # the most in flight seen by a poll of GET /api/queues/Q


async def one_drain(
    target: LeasecastTarget, backend: str, setting: str, args: argparse.Namespace
) -> Row:
    row = Row(backend, setting, args.messages)
    queue = f"limits-{setting}-{int(time.time() * 1000)}"
    changes = dict(SETTINGS[setting])
    if changes.get("max_in_flight") == -1:
        changes["max_in_flight"] = 2 * args.workers * args.prefetch
    elif changes.get("max_in_flight") == -2:
        changes["max_in_flight"] = args.binding
    url = f"{target.gateway.http}/api/queues/{queue}"
    status, body = await ahttp("PATCH", url, token_of(target), changes)
    if status != 200:
        raise RuntimeError(body)
    await target.produce(queue, args.messages, batched=True, fields=lambda i: {})
    most = 0
    polling = True

    async def poll() -> None:
        nonlocal most
        while polling:
            status, doc = await ahttp("GET", url, token_of(target))
            if status == 200:
                most = max(most, doc["in_flight"])
            await asyncio.sleep(0.2)

    poller = asyncio.create_task(poll())
    pid = gateway_pid(target)
    cpu = process_cpu_seconds(pid)
    seconds = await drain(
        target, queue, args.messages, args.workers, args.prefetch, batched=True, log=[]
    )
    row.gateway_cpu = (process_cpu_seconds(pid) - cpu) / seconds
    polling = False
    await poller
    row.drain_per_s = args.messages / seconds
    row.most_in_flight = most
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rows: list[Row] = []
    with ExitStack() as stack:
        for backend in args.backends:
            target = start_gateway(stack, backend)
            if isinstance(target, str):
                print(f"{backend}: skipped ({target})", file=sys.stderr)
                continue
            mine: list[Row] = []
            for setting in [*ROUND * args.rounds, "binding", "off"]:
                row = await one_drain(target, backend, setting, args)
                mine.append(row)
                print(f"   {asdict(row)}", file=sys.stderr, flush=True)
            base = statistics.median(r.drain_per_s for r in mine if r.setting == "off")
            for row in mine:
                row.vs_off = row.drain_per_s / base
            rows += mine
    return {"rows": [asdict(r) for r in rows], "args": vars(args)}


def summary(rows: list[dict[str, Any]]) -> str:
    """Per backend and setting: the median drain/s of its runs, against ``off``'s."""
    lines = [
        "| backend | setting | runs | median drain/s | vs off | most in flight |",
        "|---|---|---:|---:|---:|---:|",
    ]
    keys = dict.fromkeys((r["backend"], r["setting"]) for r in rows)
    for backend, setting in keys:
        mine = [r for r in rows if (r["backend"], r["setting"]) == (backend, setting)]
        off = [r["drain_per_s"] for r in rows if (r["backend"], r["setting"]) == (backend, "off")]
        median = statistics.median(r["drain_per_s"] for r in mine)
        lines.append(
            f"| {backend} | {setting} | {len(mine)} | {median:,.0f} "
            f"| {median / statistics.median(off):.2f}x | {max(r['most_in_flight'] for r in mine)} |"
        )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| backend | setting | messages | drain/s | vs off | gateway CPU | most in flight |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['setting']} | {r['messages']:,} | {r['drain_per_s']:,.0f} "
            f"| {r['vs_off']:.2f}x | {r['gateway_cpu']:.0%} | {r['most_in_flight']} |"
        )
    return "\n".join(lines)


# -- the store alone: what a lease round costs under each setting ------------------

#: Settings of the store-level runs: ``unguarded`` is the lease statement as
#: it was before the guard (the control path's statement), the cost floor.
STORE_SETTINGS: dict[str, dict[str, Any]] = {
    "unguarded": {},
    "guarded": {},
    "max_in_flight": {"max_in_flight": 1_000_000},
    "rate_limit": {"rate_limit": 1_000_000, "rate_burst": 1_000_000},
}


def store_costs(backend: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Lease rounds per second through a :class:`~gateway.store.Store` (no
    server, no sockets): ``--messages`` messages leased ``--round`` at a time,
    each round acked in the next batch; ``--rounds`` interleaved rounds."""
    import sqlite3
    import tempfile
    from pathlib import Path

    from gateway.core.protocol import EnqueueSpec
    from gateway.store import (
        POSTGRESQL,
        SQLITE,
        Ack,
        Configure,
        Enqueue,
        Lease,
        LeaseResult,
        Op,
        Store,
    )
    from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database

    var = Path(tempfile.mkdtemp(prefix=f"leasecast-bench-limits-{backend}-"))
    if backend == "postgres":
        if postgres_unavailable():
            return []
        database = postgres_database(var)
    else:
        database = sqlite_database(var)
    rows: list[dict[str, Any]] = []
    with database as env:
        if backend == "postgres":
            import psycopg

            url = env["DATABASE_URL"]
            store = Store(
                lambda: psycopg.connect(url, autocommit=True), POSTGRESQL, clock=time.time
            )
        else:
            path = env["GATEWAY_SQLITE_PATH"]
            store = Store(
                lambda: sqlite3.connect(path, isolation_level=None), SQLITE, clock=time.time
            )
        dialect = store.dialect
        try:
            for r in range(args.rounds):
                for setting, changes in STORE_SETTINGS.items():
                    queue = f"stmt-{setting}-{r}"
                    store.run([Configure(queue, changes)])
                    body = EnqueueSpec(b'{"x": 1}')
                    for start in range(0, args.messages, 1000):
                        count = min(1000, args.messages - start)
                        store.run([Enqueue(queue, [body] * count)])
                    if setting == "unguarded":
                        # This dialect object's lease, never guarded (a bench-only shim).
                        unguarded = functools.partialmethod(type(dialect).lease, guarded=False)
                        setattr(dialect, "lease", unguarded.__get__(dialect))  # noqa: B010
                    try:
                        spent, leased = 0.0, 0
                        pending: list[Op] = []
                        while leased < args.messages:
                            t0 = time.perf_counter()
                            (got,) = store.run([Lease(queue, args.round)])
                            spent += time.perf_counter() - t0
                            assert isinstance(got, LeaseResult), got
                            leased += len(got.delivered)
                            if pending:
                                store.run(pending)
                            pending = [Ack(d.receipt) for d in got.delivered]
                        store.run(pending)
                    finally:
                        if setting == "unguarded":
                            delattr(dialect, "lease")
                    row = {
                        "backend": backend,
                        "setting": setting,
                        "round": r,
                        "lease_rounds_per_s": (args.messages / args.round) / spent,
                    }
                    rows.append(row)
                    print(f"   {row}", file=sys.stderr, flush=True)
        finally:
            store.close()
    return rows


def store_table(rows: list[dict[str, Any]]) -> str:
    """Per backend and setting: median lease rounds/s, against ``unguarded``."""
    lines = [
        "| backend | setting | runs | median lease rounds/s | vs unguarded |",
        "|---|---|---:|---:|---:|",
    ]
    for backend, setting in dict.fromkeys((r["backend"], r["setting"]) for r in rows):
        mine = [
            r["lease_rounds_per_s"]
            for r in rows
            if (r["backend"], r["setting"]) == (backend, setting)
        ]
        base = [
            r["lease_rounds_per_s"]
            for r in rows
            if (r["backend"], r["setting"]) == (backend, "unguarded")
        ]
        median = statistics.median(mine)
        lines.append(
            f"| {backend} | {setting} | {len(mine)} | {median:,.0f} "
            f"| {median / statistics.median(base):.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--binding", type=int, default=20, help="max_in_flight of 'binding'")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of off/on settings")
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument(
        "--store",
        action="store_true",
        help="measure lease rounds through the store alone (no server), per setting",
    )
    parser.add_argument("--round", type=int, default=10, help="--store: messages per lease")
    args = parser.parse_args(argv)
    if args.store:
        rows = [row for backend in args.backends for row in store_costs(backend, args)]
        print(store_table(rows))
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"rows": rows, "args": vars(args)}, out, indent=2)
        return
    result = asyncio.run(run(args))
    print(table(result["rows"]))
    print()
    print(summary(result["rows"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
