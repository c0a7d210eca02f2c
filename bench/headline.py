"""Headline comparisons: Leasecast against the strongest peers, in one run (``make bench``).

    python -m bench.headline                       # 3 rounds; writes bench/results/headline.json
    python -m bench.headline --write-docs docs/benchmarks.md   # and the tables there (make bench)
    python -m bench.headline --quick               # a smoke run: 2,000 cycles, 1 round

One asyncio load generator (``bench.peers.base``) drives every system, in
alternation (each round starts one system further on), 3 rounds by default:

1. **Work queue**: ``--cycles`` cycles (enqueue, delivery, ack) on a fresh
   queue, ``--producers`` producers with ``--window`` unconfirmed each,
   ``--workers`` workers with ``--prefetch``. Leasecast on SQLite and on
   PostgreSQL through ``leasecast.Producer``/``Worker``, the default path
   and v1 frames; RabbitMQ (durable, confirms); NATS JetStream (WorkQueue
   stream, file storage); pgqueuer (on the same PostgreSQL server),
   per-message and batched enqueues. Server CPU per cycle comes from
   ``/proc`` (the gateway; ``nats-server``; ``beam.smp``; PostgreSQL's
   postmaster and backends) beside the client's and the rest of the machine's.
2. **Latency**: enqueue to delivery at a paced ``--latency-rate`` messages/s
   (one producer), p50 and p99 per round.
3. **Fan-out**: ``--subscribers`` subscribers, ``--fanout-messages``
   publishes (100 unconfirmed at most): the gateway with raw sockets and
   with ``leasecast.Subscriber``, ``websockets.broadcast``, NATS core,
   Mosquitto at QoS 0.
4. **Resume**: ``--missed`` messages published while nobody listens, then
   read back from the position before them: a topic with history on one
   gateway process (embedded) and on a gateway with Redis, by a raw socket
   and by ``leasecast.Subscriber``; a JetStream stream (file storage) by an
   ordered consumer.

A system whose server does not answer is skipped, with the reason printed
and kept in the JSON. Each system's durability (what a confirmation means,
when it fsyncs) is printed with the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.fanout import Target, start_process
from bench.peers import mqtt, nats_core, nats_js
from bench.peers.base import (
    FanoutPeer,
    QueuePeer,
    ResumePeer,
    fanout,
    percentile,
    port_unavailable,
    queue_cycles,
    resume,
)
from bench.peers.leasecast import (
    ClientSubscriberFanout,
    LeasecastQueue,
    LeasecastResume,
    RawSocketFanout,
)
from bench.peers.pgq import PgQueuerQueue, postgres_unavailable
from bench.peers.rabbit import RabbitQueue, rabbit_unavailable
from bench.procstat import loadavg, machine_busy_seconds, parent_of, tree_cpu_seconds
from bench.workqueue import start_gateway
from tests.support.databases import PG_ADMIN_URL
from tests.support.gateways import free_port

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- headline:begin (written by `make bench`: python -m bench.headline) -->"
END = "<!-- headline:end -->"
QUEUE_ORDER = (
    "leasecast-sqlite",
    "leasecast-sqlite-v1",
    "leasecast-postgres",
    "leasecast-postgres-v1",
    "rabbitmq",
    "nats-jetstream",
    "pgqueuer",
    "pgqueuer-batched",
)
FANOUT_ORDER = (
    "leasecast-raw",
    "leasecast-subscriber",
    "websockets-broadcast",
    "nats-core",
    "mosquitto-qos0",
)
RESUME_ORDER = (
    "leasecast-embedded",
    "leasecast-redis",
    "leasecast-redis-subscriber",
    "nats-jetstream-ordered",
)
ALL_SYSTEMS = QUEUE_ORDER + FANOUT_ORDER + RESUME_ORDER
#: The Redis the resume's gateway keeps its topics in (its keys removed afterwards).
REDIS_URL = os.environ.get("LEASECAST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


#: (argument, the full run's value, --quick's value, help)
SIZES: list[tuple[str, int | float, int | float, str]] = [
    ("cycles", 20_000, 2_000, "cycles per measurement"),
    ("rounds", 3, 1, "rounds, systems in alternation"),
    ("producers", 4, 4, "producer connections"),
    ("window", 500, 500, "unconfirmed enqueues per producer"),
    ("workers", 4, 4, "worker connections"),
    ("prefetch", 100, 100, "deliveries a worker holds"),
    ("latency_rate", 500.0, 500.0, "messages/s of the paced latency runs"),
    ("latency_messages", 3_000, 500, "messages per paced latency run"),
    ("subscribers", 100, 20, "fan-out subscribers"),
    ("fanout_messages", 2_000, 200, "fan-out publishes"),
    ("missed", 10_000, 1_000, "messages a resume reads back"),
    ("warmup", 1_000, 0, "warm-up cycles per system first (0: none)"),
]


def rotated(round_: int, items: list[Any]) -> list[Any]:
    """Round 1 in order, round 2 from the second item, and so on."""
    k = (round_ - 1) % len(items) if items else 0
    return items[k:] + items[:k]


def postmaster_pid() -> int:
    """The PostgreSQL server's postmaster (to count its CPU), or 0 if it cannot be seen."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        return parent_of(int(row[0])) if row else 0
    except Exception:
        return 0


# -- the systems --------------------------------------------------------------


def queue_peers(
    stack: ExitStack, wanted: set[str], skipped: dict[str, str]
) -> list[tuple[QueuePeer, bool]]:
    """The work-queue systems that answer, each with whether to count PostgreSQL beside it."""
    peers: list[tuple[QueuePeer, bool]] = []
    for database in ("sqlite", "postgres"):
        names = {f"leasecast-{database}", f"leasecast-{database}-v1"} & wanted
        if not names:
            continue
        started = start_gateway(stack, database, server="daphne")
        if isinstance(started, str):
            for name in names:
                skipped[name] = started
            continue
        for batch in (True, False):
            peer = LeasecastQueue(started, batch=batch, database=database)
            if peer.name in wanted:
                peers.append((peer, database == "postgres"))
    if "rabbitmq" in wanted:
        if reason := rabbit_unavailable():
            skipped["rabbitmq"] = reason
        else:
            peers.append((RabbitQueue(), False))
    if "nats-jetstream" in wanted:
        if reason := nats_js.unavailable():
            skipped["nats-jetstream"] = reason
        else:
            peers.append((nats_js.JetStreamQueue(), False))
    for batch in (False, True):
        name = "pgqueuer" + ("-batched" if batch else "")
        if name in wanted:
            if reason := postgres_unavailable():
                skipped[name] = reason
            else:
                # Its server is PostgreSQL: counted once, as the server.
                peers.append((PgQueuerQueue(batch=batch), False))
    return peers


def fanout_peers(stack: ExitStack, wanted: set[str], skipped: dict[str, str]) -> list[FanoutPeer]:
    """The fan-out systems that answer (the gateway on SQLite, the websockets server here)."""
    peers: list[FanoutPeer] = []
    if {"leasecast-raw", "leasecast-subscriber"} & wanted:
        started = start_gateway(stack, "sqlite", server="daphne")
        if isinstance(started, str):
            skipped["leasecast-raw"] = skipped["leasecast-subscriber"] = started
        else:
            proc = started.gateway.proc
            pids = [proc.pid] if proc is not None else []
            target = Target("leasecast", started.gateway.ws, started.headers, True)
            promise = "drop_oldest buffer of a capacity >= the messages; credit as given"
            if "leasecast-raw" in wanted:
                peers.append(
                    RawSocketFanout(
                        "leasecast-raw", target, pids, promise + " (1,000,000,000 on raw sockets)"
                    )
                )
            if "leasecast-subscriber" in wanted:
                peers.append(
                    ClientSubscriberFanout(
                        "leasecast-subscriber",
                        target,
                        pids,
                        promise + " (the client's default, 256, granted as it reads)",
                    )
                )
    if "websockets-broadcast" in wanted:
        port = free_port()
        pid = start_process(
            stack, [sys.executable, "-m", "bench.websockets_baseline", str(port)], port
        )
        target = Target("websockets", f"ws://127.0.0.1:{port}", {}, False)
        peers.append(
            RawSocketFanout(
                "websockets-broadcast",
                target,
                [pid],
                "at most once: written to every socket at once, no buffer policy",
            )
        )
    if "nats-core" in wanted:
        if reason := nats_core.unavailable():
            skipped["nats-core"] = reason
        else:
            peers.append(nats_core.NatsCoreFanout())
    if "mosquitto-qos0" in wanted:
        if reason := mqtt.unavailable():
            skipped["mosquitto-qos0"] = reason
        else:
            peers.append(mqtt.MosquittoFanout())
    return peers


def resume_peers(stack: ExitStack, wanted: set[str], skipped: dict[str, str]) -> list[ResumePeer]:
    """The resume systems that answer: a gateway without Redis and one with it
    (each on a fresh SQLite database), JetStream."""
    peers: list[ResumePeer] = []
    kept = "topic history (history_size >= the missed count)"
    if "leasecast-embedded" in wanted:
        started = start_gateway(stack, "sqlite", server="daphne")
        if isinstance(started, str):
            skipped["leasecast-embedded"] = started
        else:
            delivery = f"{kept} in the gateway process's memory; a raw socket, credit unlimited"
            peers.append(
                LeasecastResume("leasecast-embedded", started, client=False, delivery=delivery)
            )
    redis_names = {"leasecast-redis", "leasecast-redis-subscriber"} & wanted
    if redis_names:
        host, _, port = REDIS_URL.split("//")[1].split("/")[0].partition(":")
        reason = port_unavailable("Redis", int(port or 6379), host)
        prefix = f"lcheadline{uuid.uuid4().hex[:8]}"
        env = {"REDIS_URL": REDIS_URL, "GATEWAY_REDIS_PREFIX": prefix}
        started = reason or start_gateway(stack, "sqlite", server="daphne", extra_env=env)
        if isinstance(started, str):
            for name in redis_names:
                skipped[name] = started
        else:
            stack.callback(_forget_redis_keys, prefix)
            stored = f"{kept} in a Redis stream (Redis as run: nothing on disk)"
            if "leasecast-redis" in wanted:
                delivery = f"{stored}; a raw socket, credit unlimited"
                peers.append(
                    LeasecastResume("leasecast-redis", started, client=False, delivery=delivery)
                )
            if "leasecast-redis-subscriber" in wanted:
                delivery = f"{stored}; `leasecast.Subscriber` (credit 256, granted as it reads)"
                peers.append(
                    LeasecastResume(
                        "leasecast-redis-subscriber", started, client=True, delivery=delivery
                    )
                )
    if "nats-jetstream-ordered" in wanted:
        if reason := nats_js.unavailable():
            skipped["nats-jetstream-ordered"] = reason
        else:
            peers.append(nats_js.JetStreamResume())
    return peers


def _forget_redis_keys(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(f"{prefix}:*"))
    if keys:
        client.delete(*keys)


# -- measurements -------------------------------------------------------------


async def measure_cycles(
    peer: QueuePeer, postgres: bool, postmaster: int, args: argparse.Namespace, round_: int
) -> dict[str, Any]:
    """One saturating measurement of ``peer``, with the CPU each side used."""
    await asyncio.sleep(0.2)  # the previous measurement's connections closed
    load = loadavg()
    server0 = peer.server_cpu()
    own_db = peer.database_cpu() if postgres else None
    db0 = (
        own_db
        if own_db is not None
        else (tree_cpu_seconds(postmaster) if postgres and postmaster else None)
    )
    client0 = time.process_time()
    busy0 = machine_busy_seconds()
    wall0 = time.perf_counter()
    seconds = await queue_cycles(
        peer,
        args.cycles,
        producers=args.producers,
        window=args.window,
        workers=args.workers,
        prefetch=args.prefetch,
    )
    wall = time.perf_counter() - wall0  # the CPU readings' window: set-up and close included
    server1 = peer.server_cpu()
    server = server1 - server0 if server0 is not None and server1 is not None else None
    db = None
    if db0 is not None:
        now = peer.database_cpu() if own_db is not None else tree_cpu_seconds(postmaster)
        db = now - db0 if now is not None else None
    client = time.process_time() - client0
    others = max(0.0, machine_busy_seconds() - busy0 - client - (server or 0) - (db or 0))
    n = args.cycles
    return {
        "system": peer.name,
        "round": round_,
        "cycles": n,
        "seconds": seconds,
        "cycles_per_s": n / seconds,
        "server_us_per_cycle": server / n * 1e6 if server is not None else None,
        "database_us_per_cycle": db / n * 1e6 if db is not None else None,
        "client_us_per_cycle": client / n * 1e6,
        "others_busy": others / wall,
        "loadavg": load,
    }


async def measure_latency(peer: QueuePeer, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    """Enqueue-to-delivery latency at a paced rate: p50 and p99 of one run."""
    await asyncio.sleep(0.2)
    latencies: list[float] = []
    await queue_cycles(
        peer,
        args.latency_messages,
        producers=1,
        window=args.window,
        workers=args.workers,
        prefetch=args.prefetch,
        pace=args.latency_rate,
        latencies=latencies,
    )
    return {
        "system": peer.name,
        "round": round_,
        "rate": args.latency_rate,
        "messages": len(latencies),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "loadavg": loadavg(),
    }


async def measure_fanout(peer: FanoutPeer, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    """One fan-out measurement, with the server's CPU per delivery where it can be seen."""
    from bench.procstat import cpu_of

    await asyncio.sleep(0.2)
    pids = peer.server_pids()
    cpu0 = cpu_of(pids) if pids else None
    result = await fanout(peer, args.subscribers, args.fanout_messages)
    cpu = cpu_of(pids) - cpu0 if cpu0 is not None else None
    return {
        "system": peer.name,
        "round": round_,
        "subscribers": result.subscribers,
        "messages": result.messages,
        "delivered": result.delivered,
        "deliveries_per_s": result.deliveries_per_s,
        "p50_ms": percentile(result.latencies, 0.5) * 1000,
        "p99_ms": percentile(result.latencies, 0.99) * 1000,
        "server_us_per_delivery": cpu / result.delivered * 1e6
        if cpu is not None and result.delivered
        else None,
        "loadavg": loadavg(),
    }


async def measure_resume(peer: ResumePeer, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    """One resume of ``--missed`` messages, with the server's CPU per message replayed."""
    from bench.procstat import cpu_of

    await asyncio.sleep(0.2)
    pids = peer.server_pids()
    position = await peer.fill(args.missed)
    cpu0 = cpu_of(pids) if pids else None
    result = await resume(peer, position, args.missed)
    cpu = cpu_of(pids) - cpu0 if cpu0 is not None else None
    return {
        "system": peer.name,
        "round": round_,
        "missed": result.missed,
        "received": result.received,
        "in_order": result.in_order,
        "ms": result.seconds * 1000,
        "messages_per_s": result.messages_per_s,
        "server_us_per_message": cpu / result.received * 1e6
        if cpu is not None and result.received
        else None,
        "loadavg": loadavg(),
    }


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def guarded(
    name: str, skipped: dict[str, str], measurement: Awaitable[Any]
) -> dict[str, Any] | None:
    """A measurement, or None with the reason kept when the system failed mid-run."""
    try:
        row: dict[str, Any] = await measurement
    except Exception as exc:  # a peer's server went away: keep the others' figures
        skipped[name] = f"failed mid-run: {exc!r}"
        say(f"   {name}: {skipped[name]}")
        return None
    return row


async def run(args: argparse.Namespace) -> dict[str, Any]:
    skipped: dict[str, str] = {}
    samples: list[dict[str, Any]] = []
    latencies: list[dict[str, Any]] = []
    fanouts: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    durability: dict[str, str] = {}
    postmaster = postmaster_pid()
    with ExitStack() as stack:
        started: list[tuple[QueuePeer, bool]] = []
        for peer, postgres in queue_peers(stack, set(args.systems), skipped):
            try:
                await peer.start()
            except Exception as exc:
                skipped[peer.name] = f"could not start: {exc!r}"
                continue
            started.append((peer, postgres))
            durability[peer.name] = peer.durability
        for name, reason in skipped.items():
            say(f"   skipped {name}: {reason}")
        try:
            if args.warmup:
                say("   warming up")
                for peer, _ in started:
                    await guarded(
                        peer.name,
                        skipped,
                        queue_cycles(
                            peer, args.warmup, producers=1, window=100, workers=2, prefetch=10
                        ),
                    )
            for round_ in range(1, args.rounds + 1):
                for peer, postgres in rotated(round_, started):
                    if peer.name in skipped:
                        continue
                    row = await guarded(
                        peer.name,
                        skipped,
                        measure_cycles(peer, postgres, postmaster, args, round_),
                    )
                    if row:
                        samples.append(row)
                        say(
                            f"   round {round_} {peer.name}: {row['cycles_per_s']:,.0f} cycles/s,"
                            f" load {row['loadavg']}"
                        )
                for peer, _ in rotated(round_, started):
                    if peer.name in skipped:
                        continue
                    row = await guarded(
                        peer.name,
                        skipped,
                        measure_latency(peer, args, round_),
                    )
                    if row:
                        latencies.append(row)
                        say(
                            f"   round {round_} {peer.name} at {row['rate']:,.0f}/s: "
                            f"p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms"
                        )
        finally:
            for peer, _ in started:
                try:
                    await peer.close()
                except Exception as exc:
                    skipped.setdefault(f"{peer.name} cleanup", repr(exc))
        before = set(skipped)
        fans = fanout_peers(stack, set(args.systems), skipped)
        for name in set(skipped) - before:
            say(f"   skipped {name}: {skipped[name]}")
        for fan in fans:
            durability[fan.name] = fan.delivery
        for round_ in range(1, args.rounds + 1):
            for fan in rotated(round_, fans):
                row = await guarded(
                    fan.name,
                    skipped,
                    measure_fanout(fan, args, round_),
                )
                if row:
                    fanouts.append(row)
                    say(
                        f"   round {round_} {fan.name}: {row['deliveries_per_s']:,.0f} "
                        f"deliveries/s, {row['delivered']:,} of "
                        f"{row['subscribers'] * row['messages']:,}"
                    )
        await measure_resumes(stack, args, skipped, durability, resumes)
    return {
        "samples": samples,
        "latencies": latencies,
        "fanout": fanouts,
        "resume": resumes,
        "durability": durability,
        "skipped": skipped,
    }


# -- tables -------------------------------------------------------------------


async def measure_resumes(
    stack: ExitStack,
    args: argparse.Namespace,
    skipped: dict[str, str],
    durability: dict[str, str],
    rows: list[dict[str, Any]],
) -> None:
    """Every resume system, ``--rounds`` times in alternation, into ``rows``."""
    before = set(skipped)
    peers: list[ResumePeer] = []
    for peer in resume_peers(stack, set(args.systems), skipped):
        try:
            await peer.start()
        except Exception as exc:
            skipped[peer.name] = f"could not start: {exc!r}"
            continue
        peers.append(peer)
        durability[peer.name] = peer.delivery
    for name in set(skipped) - before:
        say(f"   skipped {name}: {skipped[name]}")
    try:
        for round_ in range(1, args.rounds + 1):
            for peer in rotated(round_, peers):
                if peer.name in skipped:
                    continue
                row = await guarded(peer.name, skipped, measure_resume(peer, args, round_))
                if row:
                    rows.append(row)
                    order = "in order" if row["in_order"] else "NOT in order"
                    say(
                        f"   round {round_} {peer.name}: {row['received']:,} of "
                        f"{row['missed']:,} read back in {row['ms']:,.0f} ms, {order}"
                    )
    finally:
        for peer in peers:
            try:
                await peer.close()
            except Exception as exc:
                skipped.setdefault(f"{peer.name} cleanup", repr(exc))


def _spread(values: list[float], fmt: str = ",.0f") -> tuple[str, str]:
    """The median and the ``min-max`` range of ``values``, formatted."""
    if not values:
        return "-", "-"
    return (
        format(statistics.median(values), fmt),
        f"{format(min(values), fmt)}-{format(max(values), fmt)}",
    )


def _us(rows: list[dict[str, Any]], key: str, fmt: str = ",.0f") -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return format(statistics.median(values), fmt) if values else "n/a"


def _ratio(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> str:
    """Per round: this system's cycles/s over the base's; the median and the rounds."""
    per_round = {r["round"]: r["cycles_per_s"] for r in base}
    ratios = [r["cycles_per_s"] / per_round[r["round"]] for r in rows if r["round"] in per_round]
    if not ratios:
        return "-"
    return f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"


def queue_table(data: dict[str, Any]) -> str:
    """Markdown: cycles/s per system (median, range), ratios, CPU per cycle."""
    lines = [
        "| system | cycles/s (median) | min-max | vs RabbitMQ | vs JetStream "
        "| server CPU us/cycle | PostgreSQL CPU us/cycle | client CPU us/cycle | others busy |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    rows = data["samples"]

    def of(name: str) -> list[dict[str, Any]]:
        return [r for r in rows if r["system"] == name]

    names = [n for n in QUEUE_ORDER if of(n)] + sorted(
        {r["system"] for r in rows} - set(QUEUE_ORDER)
    )
    for name in names:
        mine = of(name)
        median, spread = _spread([r["cycles_per_s"] for r in mine])
        busy = statistics.median(r["others_busy"] for r in mine)
        lines.append(
            f"| {name} | {median} | {spread} | {_ratio(mine, of('rabbitmq'))} "
            f"| {_ratio(mine, of('nats-jetstream'))} | {_us(mine, 'server_us_per_cycle')} "
            f"| {_us(mine, 'database_us_per_cycle')} | {_us(mine, 'client_us_per_cycle')} "
            f"| {busy:.0%} |"
        )
    return "\n".join(lines)


def latency_table(data: dict[str, Any]) -> str:
    """Markdown: p50 and p99 per system (median over rounds, range)."""
    lines = [
        "| system | rate | p50 ms (median) | p50 min-max | p99 ms (median) | p99 min-max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = data["latencies"]
    for name in [n for n in QUEUE_ORDER if any(r["system"] == n for r in rows)]:
        mine = [r for r in rows if r["system"] == name]
        p50, p50_range = _spread([r["p50_ms"] for r in mine], ".1f")
        p99, p99_range = _spread([r["p99_ms"] for r in mine], ".1f")
        rate = f"{mine[0]['rate']:,.0f}/s"
        lines.append(f"| {name} | {rate} | {p50} | {p50_range} | {p99} | {p99_range} |")
    return "\n".join(lines)


def fanout_table(data: dict[str, Any]) -> str:
    """Markdown: deliveries/s per system (median, range), delivered, latency, CPU."""
    lines = [
        "| system | subscribers x messages | delivered (min) | deliveries/s (median) "
        "| min-max | p50 ms | p99 ms | server CPU us/delivery |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = data["fanout"]
    for name in [n for n in FANOUT_ORDER if any(r["system"] == n for r in rows)]:
        mine = [r for r in rows if r["system"] == name]
        median, spread = _spread([r["deliveries_per_s"] for r in mine])
        shape = f"{mine[0]['subscribers']:,} x {mine[0]['messages']:,}"
        lines.append(
            f"| {name} | {shape} | {min(r['delivered'] for r in mine):,} | {median} | {spread} "
            f"| {statistics.median(r['p50_ms'] for r in mine):.1f} "
            f"| {statistics.median(r['p99_ms'] for r in mine):.1f} "
            f"| {_us(mine, 'server_us_per_delivery', '.1f')} |"
        )
    return "\n".join(lines)


def resume_table(data: dict[str, Any]) -> str:
    """Markdown: time to read back what was missed (median, range), and against JetStream."""
    lines = [
        "| system | read back (min) | in order | ms (median) | min-max | messages/s "
        "| vs JetStream (time, per round) | server CPU us/message |",
        "|---|---:|---|---:|---:|---:|---|---:|",
    ]
    rows = data.get("resume", [])
    base = {r["round"]: r["ms"] for r in rows if r["system"] == "nats-jetstream-ordered"}
    for name in [n for n in RESUME_ORDER if any(r["system"] == n for r in rows)]:
        mine = [r for r in rows if r["system"] == name]
        median, spread = _spread([r["ms"] for r in mine], ",.0f")
        # Below 1: faster than JetStream's ordered consumer in the same round.
        ratios = [r["ms"] / base[r["round"]] for r in mine if r["round"] in base]
        versus = (
            f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
            if ratios
            else "-"
        )
        ordered = sum(1 for r in mine if r["in_order"])
        lines.append(
            f"| {name} | {min(r['received'] for r in mine):,} | {ordered} of {len(mine)} "
            f"| {median} | {spread} | {statistics.median(r['messages_per_s'] for r in mine):,.0f} "
            f"| {versus} | {_us(mine, 'server_us_per_message', '.1f')} |"
        )
    return "\n".join(lines)


def durability_table(data: dict[str, Any]) -> str:
    """Markdown: what each system's confirmation means."""
    lines = ["| system | durability / delivery (as run) |", "|---|---|"]
    lines += [f"| {name} | {text} |" for name, text in data["durability"].items()]
    return "\n".join(lines)


def report(data: dict[str, Any]) -> str:
    """Every table, with the run's shape, commit and load."""
    a = data["args"]
    parts = [
        f"Run {data['when']} (commit {data['commit']}), {data['cores']} cores, "
        f"load average {data['load_before']} before and {data['load_after']} after, "
        f"{data['seconds']:.0f} s; {a['rounds']} round(s), systems in alternation.",
    ]
    if data["samples"]:
        parts += [
            "",
            f"**Work queue**: {a['cycles']:,} cycles a measurement, {a['producers']} producers "
            f"x {a['window']} unconfirmed, {a['workers']} workers x prefetch {a['prefetch']}:",
            "",
            queue_table(data),
        ]
    if data["latencies"]:
        parts += [
            "",
            f"**Latency**: enqueue to delivery at a paced {a['latency_rate']:,.0f} messages/s "
            f"({a['latency_messages']:,} messages, one producer):",
            "",
            latency_table(data),
        ]
    if data["fanout"]:
        parts += [
            "",
            f"**Fan-out**: {a['subscribers']:,} subscribers, {a['fanout_messages']:,} "
            "messages, 100 publishes unconfirmed at most:",
            "",
            fanout_table(data),
        ]
    if data.get("resume"):
        parts += [
            "",
            f"**Resume**: {a['missed']:,} messages published while nobody listened, read back "
            "from the position before them (connection and handshake included); time relative "
            "to JetStream's (below 1: faster):",
            "",
            resume_table(data),
        ]
    parts += ["", "**Durability and delivery**, as each system ran:", "", durability_table(data)]
    if data["skipped"]:
        parts += ["", "Skipped: " + "; ".join(f"{k}: {v}" for k, v in data["skipped"].items())]
    return "\n".join(parts)


def write_docs(path: Path, text: str) -> None:
    """Replace what lies between the headline markers in ``path`` with ``text``."""
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no headline markers ({BEGIN!r} ... {END!r})")
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> None:
    """Run the comparisons, print the tables, keep the JSON, optionally write the docs."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.headline", description=__doc__.split("\n")[0]
    )
    # Sizes: the full run's, --quick's; one given on the command line wins over both.
    for name, full, quick, text in SIZES:
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=type(full),
            default=None,
            help=f"{text} (default {full:,}; --quick: {quick:,})",
        )
    parser.add_argument(
        "--systems",
        default=",".join(ALL_SYSTEMS),
        help="a comma-separated subset of: " + ", ".join(ALL_SYSTEMS),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: the --quick sizes above",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "bench/results/headline.json")
    parser.add_argument("--write-docs", type=Path, help="replace the tables between the markers")
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = set(args.systems) - set(ALL_SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    for name, full, quick, _ in SIZES:
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    started = time.time()
    load_before = loadavg()
    data = asyncio.run(run(args))
    data |= {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit(),
        "cores": os.cpu_count(),
        "load_before": load_before,
        "load_after": loadavg(),
        "seconds": time.time() - started,
    }
    text = report(data)
    print(text)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(data, indent=2))
    print(f"\n(figures in {args.json})")
    if args.write_docs:
        write_docs(args.write_docs, text)
        print(f"(tables written to {args.write_docs})")


if __name__ == "__main__":
    main()
