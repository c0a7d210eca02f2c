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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--binding", type=int, default=20, help="max_in_flight of 'binding'")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of off/on settings")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(table(result["rows"]))
    print()
    print(summary(result["rows"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
