"""Work queue 1.1 benchmark: groups, bounded queues and priority, on SQLite, in one run.

    python -m bench.queue_v11                  # everything, 4-5 minutes on 2 busy cores
    python -m bench.queue_v11 --quick          # a smoke run, about a minute
    python -m bench.queue_v11 --json out.json  # also write the figures

Three sections, each on a fresh gateway (daphne, SQLite) started as
``bench.workqueue`` starts it, with the same kind of load generator (one
asyncio process beside the server):

1. **Groups.** ``--groups`` groups x ``--per-group`` messages enqueued up
   front (``enqueue_many``, 100 a frame) in ``--order``: ``grouped`` (group by
   group: a group's messages one after another) or ``interleaved`` (message
   k of every group, then k+1). Then ``--workers`` sockets with ``--prefetch``
   drain the queue, acking each delivery at once; drain/s = messages / time
   from the first worker connecting to the last ack confirmed. The baseline
   is the same number of messages without groups, drained the same way in
   the same run, before and after (the ratio is against their mean).
   ``--styles``: batched (``?batch=PREFETCH`` and ``ack_many``, the default)
   and/or v1 (``deliver``/``ack``: slower, bound by the cost per frame).
   The deliveries log is checked: a delivery of group g while an earlier
   delivery of g has not been acked (its ack not yet sent) is a violation,
   and so is a group's message delivered before an earlier one of the same
   group.
2. **Bounded queue.** ``max_length`` ``--max-length``, each overflow policy in
   turn for ``--seconds``, on a queue already full when the clock starts
   (filled unbounded, then bounded with ``PATCH``): one producer sends v1
   enqueues paced at twice the rate the workers ack (the workers are
   throttled to ``--worker-rate``), with up to ``--unconfirmed`` (500)
   enqueues unconfirmed. Counted:
   accepted enqueues, ``backpressure`` refusals, dead letters by reason
   (browsed), the most messages visible or delayed seen (polled), and the
   gateway's RSS (sampled every 0.5 s).
3. **Priority in flight.** Two latencies, each the median of ``--samples``
   probes, on an empty queue and on one holding ``--inflight`` messages with
   priorities spread over -100..99:
   *in flight*: the messages all leased and unacked by 100 other sockets; a
   probe is enqueue until delivered to an idle worker (``bench.workqueue``'s
   in-flight measure). *backlog*: the messages visible; a worker holding one
   message acks it while a priority-100 probe is waiting, and the probe is
   timed from the ack until its delivery (a lease round that has to pick the
   top priority out of the backlog); the delivered message must be the probe.

Results are ratios within one run; the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.procstat import process_cpu_seconds
from bench.soak import rss_mib
from bench.workqueue import (
    WINDOW,
    LeasecastTarget,
    ack_frame,
    inflight_figures,
    percentile,
    start_gateway,
)
from tests.support.clients import ahttp

POLICIES = ("drop_newest", "drop_oldest", "block")
DELIVER, ACK = 0, 1
PRIORITY_RANGE = (-100, 99)  # the backlog's; probes are 100, above all of it


def token_of(target: LeasecastTarget) -> str:
    return target.headers["Authorization"].split(" ", 1)[1]


def gateway_pid(target: LeasecastTarget) -> int:
    assert target.gateway.proc is not None
    return target.gateway.proc.pid


# -- 1. groups ----------------------------------------------------------------


@dataclass
class GroupsRow:
    """One drain of the groups section."""

    kind: str  # "no groups" or "groups"
    style: str  # "v1" or "batched"
    messages: int
    enqueue_per_s: float = 0.0
    drain_per_s: float = 0.0
    gateway_cpu: float = 0.0  # share of one core during the drain
    deliveries: int = 0
    redelivered: int = 0
    concurrent: int = 0  # a group delivered while its previous delivery was unacked
    out_of_order: int = 0  # a group's message delivered before an earlier one of it
    incomplete_groups: int = 0  # groups without all their messages delivered once


def group_fields(groups: int, per_group: int, order: str) -> Callable[[int], dict[str, Any]]:
    """Message i's group: ``grouped`` puts a group's messages together, ``interleaved`` not."""
    if order == "grouped":
        return lambda i: {"group": f"g{i // per_group}"}
    return lambda i: {"group": f"g{i % groups}"}


async def drain(
    target: LeasecastTarget,
    queue: str,
    n: int,
    workers: int,
    prefetch: int,
    *,
    batched: bool,
    log: list[tuple[int, str | None, int, int]],
) -> float:
    """Deliver and ack ``n`` messages over ``workers`` sockets; seconds until the last ack.

    Every delivery and every ack (just before it is sent) goes into ``log`` as
    ``(DELIVER | ACK, group, i, deliveries)``. The load generator is one event
    loop, so the log's order is the order things happened at the client: an
    ack is logged before the gateway can have seen it.
    """
    acked = 0
    done = asyncio.Event()
    query = f"prefetch={prefetch}" + (f"&batch={prefetch}" if batched else "")

    async def worker() -> None:
        nonlocal acked
        async with await target.socket(f"/ws/queues/{queue}/?{query}") as ws:
            while not done.is_set():
                try:
                    text = await asyncio.wait_for(ws.recv(), 1.0)
                except TimeoutError:
                    continue
                frame = orjson.loads(text)
                op = frame["op"]
                if op in ("acked", "acked_many"):
                    acked += frame.get("acked", 1)
                    if acked >= n:
                        done.set()
                    continue
                if op == "deliver":
                    items = [frame]
                elif op == "deliveries":
                    items = frame["items"]
                else:
                    raise RuntimeError(frame)
                for item in items:
                    log.append((DELIVER, item.get("group"), item["body"]["i"], item["deliveries"]))
                for item in items:
                    log.append((ACK, item.get("group"), item["body"]["i"], 0))
                if op == "deliver":
                    await ws.send(ack_frame(frame["receipt"]))
                else:
                    receipts = [item["receipt"] for item in items]
                    await ws.send(orjson.dumps({"op": "ack_many", "receipts": receipts}).decode())

    start = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    await done.wait()
    seconds = time.perf_counter() - start
    await asyncio.gather(*tasks)
    return seconds


def check_log(row: GroupsRow, log: list[tuple[int, str | None, int, int]], per_group: int) -> None:
    """Count the ordering violations of ``log`` into ``row`` (see :func:`drain`)."""
    unacked: dict[str, int] = {}
    last: dict[str, int] = {}
    delivered: Counter[str] = Counter()
    for kind, group, i, deliveries in log:
        if kind == ACK:
            if group is not None and unacked.get(group) == i:
                del unacked[group]
            continue
        row.deliveries += 1
        row.redelivered += deliveries > 1
        if group is None:
            continue
        delivered[group] += 1
        if group in unacked:
            row.concurrent += 1
        unacked[group] = i
        if last.get(group, -1) >= i:
            row.out_of_order += 1
        last[group] = i
    if row.kind == "groups":
        expected = row.messages // per_group
        complete = sum(1 for count in delivered.values() if count == per_group)
        row.incomplete_groups = expected - complete


async def groups_section(target: LeasecastTarget, args: argparse.Namespace) -> list[GroupsRow]:
    n = args.groups * args.per_group
    fields = group_fields(args.groups, args.per_group, args.order)
    pid = gateway_pid(target)
    rows = []
    for style in args.styles:
        batched = style == "batched"
        # The baseline before and after, against the machine's drifting load.
        for kind in ("no groups", "groups", "no groups"):
            row = GroupsRow(kind, style, n)
            queue = f"groups-{style}-{'g' if kind == 'groups' else 'n'}-{int(time.time() * 1000)}"
            seconds = await target.produce(
                queue,
                n,
                batched=True,
                fields=fields if kind == "groups" else (lambda i: {}),
            )
            row.enqueue_per_s = n / seconds
            log: list[tuple[int, str | None, int, int]] = []
            cpu = process_cpu_seconds(pid)
            seconds = await drain(
                target, queue, n, args.workers, args.prefetch, batched=batched, log=log
            )
            row.gateway_cpu = (process_cpu_seconds(pid) - cpu) / seconds
            row.drain_per_s = n / seconds
            check_log(row, log, args.per_group)
            rows.append(row)
            print(f"   {asdict(row)}", file=sys.stderr, flush=True)
    return rows


# -- 2. bounded queue ----------------------------------------------------------


@dataclass
class BoundedRow:
    """One overflow policy's run."""

    policy: str
    seconds: float = 0.0
    offered: int = 0  # enqueues sent
    accepted: int = 0
    refused: int = 0  # backpressure
    other_errors: int = 0
    acked: int = 0
    dead: dict[str, int] = field(default_factory=dict)  # by dead_reason
    max_counted: int = 0  # most visible + delayed seen by the poller
    gateway_cpu: float = 0.0  # share of one core over the run
    rss_start: float = 0.0
    rss_mid: float = 0.0  # half way through the run
    rss_max: float = 0.0
    rss_end: float = 0.0
    notes: list[str] = field(default_factory=list)


async def browse_dead(target: LeasecastTarget, queue: str) -> dict[str, int]:
    """Dead letters of ``queue`` by ``dead_reason``, browsed page after page."""
    reasons: Counter[str] = Counter()
    after: str | None = None
    base = f"{target.gateway.http}/api/queues/{queue}/messages?state=dead&limit=1000"
    while True:
        url = base + (f"&after={after}" if after else "")
        status, page = await ahttp("GET", url, token_of(target))
        if status != 200:
            raise RuntimeError(page)
        reasons.update(str(m["dead_reason"]) for m in page["messages"])
        after = page["next"]
        if after is None:
            return dict(reasons)


async def bounded_run(
    target: LeasecastTarget,
    policy: str,
    max_length: int,
    worker_rate: float,
    seconds: float,
    workers: int = 4,
    unconfirmed: int = WINDOW,
) -> BoundedRow:
    row = BoundedRow(policy)
    queue = f"bounded-{policy}-{int(time.time() * 1000)}"
    token = token_of(target)
    url = f"{target.gateway.http}/api/queues/{queue}"
    # Full before the clock starts: filled unbounded (100 a frame), then bounded.
    await target.produce(queue, max_length, batched=True)
    status, doc = await ahttp("PATCH", url, token, {"max_length": max_length, "overflow": policy})
    if status != 200 or doc["overflow"] != policy:
        raise RuntimeError(doc)
    pid = gateway_pid(target)
    rss: list[float] = [rss_mib(pid)]
    stop = asyncio.Event()
    next_slot = time.perf_counter()

    async def pace() -> None:
        # The workers together ack at ``worker_rate``, one slot each.
        nonlocal next_slot
        now = time.perf_counter()
        slot = max(next_slot, now)
        next_slot = slot + 1 / worker_rate
        await asyncio.sleep(slot - now)

    async def worker() -> None:
        async with await target.socket(f"/ws/queues/{queue}/?prefetch=10") as ws:
            while not stop.is_set():
                try:
                    frame = orjson.loads(await asyncio.wait_for(ws.recv(), 0.5))
                except TimeoutError:
                    continue
                if frame["op"] == "deliver":
                    await pace()
                    await ws.send(ack_frame(frame["receipt"]))
                elif frame["op"] == "acked":
                    row.acked += 1
                else:
                    raise RuntimeError(frame)

    async def sampler() -> None:
        while not stop.is_set():
            rss.append(rss_mib(pid))
            status, doc = await ahttp("GET", url, token)
            if status == 200:
                row.max_counted = max(row.max_counted, doc["visible"] + doc["delayed"])
            await asyncio.sleep(0.5)

    async def producer() -> None:
        rate = 2 * worker_rate
        window = asyncio.Semaphore(unconfirmed)
        async with await target.socket("/ws/produce/") as ws:

            async def replies() -> None:
                while True:
                    reply = orjson.loads(await ws.recv())
                    if reply["op"] == "enqueued":
                        row.accepted += 1
                    elif reply.get("code") == "backpressure":
                        row.refused += 1
                    else:
                        row.other_errors += 1
                        if len(row.notes) < 3:
                            row.notes.append(str(reply))
                    window.release()

            reader = asyncio.create_task(replies())
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                await window.acquire()
                await asyncio.sleep(max(0.0, start + row.offered / rate - time.perf_counter()))
                frame = {"op": "enqueue", "queue": queue, "body": {"i": row.offered}}
                await ws.send(orjson.dumps(frame).decode())
                row.offered += 1
            for _ in range(
                unconfirmed
            ):  # every reply in (a block wait is GATEWAY_BLOCK_WAIT at most)
                await window.acquire()
            row.seconds = time.perf_counter() - start
            reader.cancel()

    cpu = process_cpu_seconds(pid)
    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    tasks.append(asyncio.create_task(sampler()))
    await producer()
    row.gateway_cpu = (process_cpu_seconds(pid) - cpu) / row.seconds
    stop.set()
    await asyncio.gather(*tasks)
    rss.append(rss_mib(pid))
    row.rss_start, row.rss_max, row.rss_end = rss[0], max(rss), rss[-1]
    row.rss_mid = rss[len(rss) // 2]
    row.dead = await browse_dead(target, queue)
    return row


async def bounded_section(target: LeasecastTarget, args: argparse.Namespace) -> list[BoundedRow]:
    rows = []
    for policy in POLICIES:
        rows.append(
            await bounded_run(
                target,
                policy,
                args.max_length,
                args.worker_rate,
                args.seconds,
                unconfirmed=args.unconfirmed,
            )
        )
        print(f"   {asdict(rows[-1])}", file=sys.stderr, flush=True)
    return rows


# -- 3. priority in flight -----------------------------------------------------


def priority_fields(seed: int = 11) -> Callable[[int], dict[str, Any]]:
    rng = random.Random(seed)
    return lambda i: {"priority": rng.randint(*PRIORITY_RANGE)}


class BacklogProbe:
    """A worker (prefetch 1) on ``queue`` that always holds one message, and its producer.

    :meth:`probe` enqueues a priority-100 probe, waits for its commit, then
    acks the held message and times the next delivery, which must be the
    probe (it outranks the whole backlog); the probe is then the one held.
    """

    def __init__(self, target: LeasecastTarget, queue: str) -> None:
        self.target = target
        self.queue = queue
        self.times: list[float] = []
        self.not_the_probe = 0

    async def __aenter__(self) -> BacklogProbe:
        self.producer = await self.target.socket("/ws/produce/")
        path = f"/ws/queues/{self.queue}/?prefetch=1&visibility_timeout=600"
        self.worker = await self.target.socket(path)
        await self._enqueue({"seed": True}, 0)  # on an empty queue, the first one to hold
        self.held = await self._delivery()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.close()
        await self.producer.close()

    async def _enqueue(self, body: Any, priority: int) -> None:
        frame = {"op": "enqueue", "queue": self.queue, "body": body, "priority": priority}
        await self.producer.send(orjson.dumps(frame).decode())
        reply = orjson.loads(await self.producer.recv())
        if reply["op"] != "enqueued":
            raise RuntimeError(reply)

    async def _delivery(self) -> dict[str, Any]:
        while True:
            frame: dict[str, Any] = orjson.loads(await asyncio.wait_for(self.worker.recv(), 30))
            if frame["op"] == "deliver":
                return frame
            if frame["op"] != "acked":
                raise RuntimeError(frame)

    async def probe(self, k: int) -> None:
        await self._enqueue({"probe": k}, 100)
        t0 = time.perf_counter()
        await self.worker.send(ack_frame(self.held["receipt"]))
        self.held = await self._delivery()
        self.times.append(time.perf_counter() - t0)
        self.not_the_probe += self.held["body"] != {"probe": k}


async def priority_section(target: LeasecastTarget, args: argparse.Namespace) -> dict[str, Any]:
    med = statistics.median
    stamp = int(time.time() * 1000)
    seconds = await target.produce(
        f"backlog{stamp}", args.inflight, batched=True, fields=priority_fields()
    )
    # Probes alternate between the empty queue and the full one, so that the
    # machine's changing load falls on both alike.
    async with (
        BacklogProbe(target, f"empty{stamp}") as empty,
        BacklogProbe(target, f"backlog{stamp}") as full,
    ):
        for k in range(args.samples):
            await empty.probe(k)
            await full.probe(k)
    backlog = {
        "messages": args.inflight,
        "fill_per_s": args.inflight / seconds,
        "ms_empty": med(empty.times) * 1000,
        "ms_full": med(full.times) * 1000,
        "p99_ms_empty": percentile(empty.times, 0.99) * 1000,
        "p99_ms_full": percentile(full.times, 0.99) * 1000,
        "not_the_probe": empty.not_the_probe + full.not_the_probe,
    }
    print(f"   backlog {backlog}", file=sys.stderr, flush=True)
    inflight = await inflight_figures(
        target, args.inflight, samples=args.samples, fields=priority_fields()
    )
    print(f"   in flight {inflight}", file=sys.stderr, flush=True)
    return {"backlog": backlog, "inflight": inflight}


# -- output --------------------------------------------------------------------


def groups_table(rows: list[GroupsRow]) -> str:
    runs: dict[str, list[float]] = {}
    for r in rows:
        if r.kind == "no groups":
            runs.setdefault(r.style, []).append(r.drain_per_s)
    base = {style: statistics.mean(rates) for style, rates in runs.items()}
    lines = [
        "| style | groups | messages | enqueue/s | drain/s | vs no groups | gateway CPU "
        "| deliveries | redelivered | concurrent | out of order | incomplete groups |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r.drain_per_s / base[r.style] if r.style in base else float("nan")
        lines.append(
            f"| {r.style} | {r.kind} | {r.messages:,} | {r.enqueue_per_s:,.0f} "
            f"| {r.drain_per_s:,.0f} | {ratio:.2f}x | {r.gateway_cpu:.0%} | {r.deliveries:,} "
            f"| {r.redelivered} | {r.concurrent} | {r.out_of_order} | {r.incomplete_groups} |"
        )
    return "\n".join(lines)


def bounded_table(rows: list[BoundedRow], max_length: int) -> str:
    lines = [
        "| overflow | seconds | offered/s | accepted/s | refused | dead (overflow) "
        "| acked/s | max visible | RSS MiB start / mid / max / end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        others = {k: v for k, v in r.dead.items() if k != "overflow"}
        dead = f"{r.dead.get('overflow', 0):,}" + (f" (+{others})" if others else "")
        lines.append(
            f"| {r.policy} | {r.seconds:.1f} | {r.offered / r.seconds:,.0f} "
            f"| {r.accepted / r.seconds:,.0f} | {r.refused:,} | {dead} "
            f"| {r.acked / r.seconds:,.0f} | {r.max_counted:,} / {max_length:,} "
            f"| {r.rss_start:.1f} / {r.rss_mid:.1f} / {r.rss_max:.1f} / {r.rss_end:.1f} |"
        )
        for note in r.notes:
            lines.append(f"|   | other error: {note} |")
    return "\n".join(lines)


def priority_table(data: dict[str, Any]) -> str:
    b, f = data["backlog"], data["inflight"]
    lines = [
        "| measure | messages | ms empty | ms full | ratio |",
        "|---|---:|---:|---:|---:|",
        f"| backlog: ack to delivery of a priority-100 probe | {b['messages']:,} visible "
        f"| {b['ms_empty']:.2f} | {b['ms_full']:.2f} | {b['ms_full'] / b['ms_empty']:.2f}x |",
        f"| backlog: the same, p99 | {b['messages']:,} visible "
        f"| {b['p99_ms_empty']:.2f} | {b['p99_ms_full']:.2f} "
        f"| {b['p99_ms_full'] / b['p99_ms_empty']:.2f}x |",
        f"| in flight: enqueue to delivery to an idle worker | {f['held']:,} leased "
        f"| {f['lease_ms_empty']:.2f} | {f['lease_ms_full']:.2f} "
        f"| {f['lease_ms_full'] / f['lease_ms_empty']:.2f}x |",
        f"| in flight: ack to acked | {f['held']:,} leased "
        f"| {f['ack_ms_empty']:.2f} | {f['ack_ms_full']:.2f} "
        f"| {f['ack_ms_full'] / f['ack_ms_empty']:.2f}x |",
    ]
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for name in args.sections:
        print(f"== {name}", file=sys.stderr, flush=True)
        with ExitStack() as stack:  # a fresh gateway and database for each section
            target = start_gateway(stack, "sqlite")
            assert not isinstance(target, str)
            if name == "groups":
                data[name] = [asdict(r) for r in await groups_section(target, args)]
            elif name == "bounded":
                data[name] = [asdict(r) for r in await bounded_section(target, args)]
            elif name == "priority":
                data[name] = await priority_section(target, args)
            else:
                raise SystemExit(f"unknown section {name!r}")
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.queue_v11", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sections", default="groups,bounded,priority")
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--per-group", type=int, default=10)
    parser.add_argument("--order", choices=("grouped", "interleaved"), default="grouped")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--styles", default="batched", help="of the groups section: v1,batched")
    parser.add_argument("--max-length", type=int, default=10_000)
    parser.add_argument("--worker-rate", type=float, default=1000.0, help="acks/s, all workers")
    parser.add_argument("--seconds", type=float, default=20.0, help="per overflow policy")
    parser.add_argument(
        "--unconfirmed", type=int, default=WINDOW, help="the bounded producer's pipeline"
    )
    parser.add_argument("--inflight", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a smoke run, about a minute")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    args.sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    args.styles = [s.strip() for s in args.styles.split(",") if s.strip()]
    if not set(args.styles) <= {"v1", "batched"}:
        parser.error("--styles: v1, batched or both")
    if args.quick:
        args.groups, args.max_length, args.seconds = 1_000, 1_000, 4.0
        args.worker_rate, args.inflight, args.samples = 500.0, 10_000, 50
    started = time.time()
    data = asyncio.run(run(args))
    if "groups" in data:
        rows = [GroupsRow(**r) for r in data["groups"]]
        print(
            f"\nGroups: {args.groups:,} groups x {args.per_group} ({args.order} order), "
            f"{args.workers} workers, prefetch {args.prefetch}:\n"
        )
        print(groups_table(rows))
        violations = sum(r.concurrent + r.out_of_order + r.incomplete_groups for r in rows)
        print(f"\nGroup order violations: {violations} (must be 0)")
    if "bounded" in data:
        brows = [BoundedRow(**r) for r in data["bounded"]]
        print(
            f"\nBounded queue: max_length {args.max_length:,}, producer paced at "
            f"{2 * args.worker_rate:,.0f}/s ({args.unconfirmed} unconfirmed at most), "
            f"workers at {args.worker_rate:,.0f}/s:\n"
        )
        print(bounded_table(brows, args.max_length))
    if "priority" in data:
        print(f"\nPriority, median of {args.samples} probes:\n")
        print(priority_table(data["priority"]))
        wrong = data["priority"]["backlog"]["not_the_probe"]
        print(f"\nDeliveries that were not the priority-100 probe: {wrong} (must be 0)")
    print(f"\n({time.time() - started:.0f} s)")
    if args.json:
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, **data}, indent=2)
        )


if __name__ == "__main__":
    main()
