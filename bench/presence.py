"""Presence churn: joins and leaves per second, and what the watchers are told.

    python -m bench.presence                  # 8 churners (+2 probes; 32 held), 10 s a phase
    python -m bench.presence --seconds 5 --churners 4
    python -m bench.presence --json bench/results/presence.json

Three phases in one run, on one PostgreSQL database (127.0.0.1:5432):

- **one**: one gateway process (daphne), no Redis: presence lives in the
  process and joins and leaves are told at once;
- **two**: two gateway processes sharing Redis (``REDIS_URL``,
  127.0.0.1:6379): presence is written to Redis in batches, each join and
  leave is published as an event that the other process tells its watchers,
  and a slower poll (2 s) tells what expired (a dead process's members);
- **two, held**: the same two processes, each membership held ``--hold``
  seconds before it is closed (no churn backlog: clean delays).

Each phase takes a fresh topic with presence on (``PATCH /api/topics/T
{"presence": true}`` with an admin token), one watcher per process (a
``/ws/`` subscription with ``presence: true``), and N churners. A churner
holds one ``/ws/`` socket on each process (signed tokens, ``sub`` ``cI``)
and, until the phase's time is up, subscribes to the topic and unsubscribes
again, each membership on the other process than the one before (on
**one**, both sockets are on the one process); each frame waits for its
reply. Joins + leaves per second is what the churners completed over the
phase's time. Beside them on **one** and **two**, ``--probes`` churners
hold each membership ``--hold`` seconds, each
on a socket of its own whose ``sub`` is ``pI.K``: every one is told apart,
so what a watcher missed of them and how late it was told of the others is
exact while the churn runs (they are not counted in the rate).

Each watcher records every ``join``, ``leave`` and ``presence`` frame (a
``presence`` frame's ``joins`` and ``leaves`` one by one). After the churn,
the run waits until the topic's presence document (``GET
/api/topics/T/presence``, read from Redis on **two**) lists the watchers
alone, and then until neither watcher has been told anything for 2.5 s
(docs/protocol.md: an open or a close is seen within about a second
everywhere; 2.5 s leaves a margin). A churner's
memberships never overlap, so where a watcher saw every membership of a
churner, the k-th member id it saw for ``cI`` is that churner's k-th
membership: the delay is from the churner's ``subscribed`` (``unsubscribed``)
reply to the watcher's receipt of the join (leave), split by whether the
membership was on the watcher's process or the other. A churner of which a
watcher missed some memberships gives no delays to that watcher (which
membership a member id was is then unknown); the counts say how many.

CPU: user + system seconds from ``/proc`` of the gateway processes, of the
Redis server and of this client process, over the churn and the wait after
it, per join or leave performed. The client (churners and watchers, one
Python process) shares the machine's cores with the gateways.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.procstat import cpu_of, loadavg, machine_busy_seconds, pids_named
from bench.workqueue import percentile
from tests.support.clients import ahttp
from tests.support.databases import REDIS_URL, postgres_database, postgres_unavailable
from tests.support.gateways import GatewayProcess
from tests.support.tokens import TEST_SIGNING_KEY, mint

#: Seconds without a presence frame after which the watchers are taken as told
#: everything (about a second by docs/protocol.md, and a margin).
QUIET = 2.5
#: Longest wait for the watchers after the churn.
DRAIN_MAX = 30.0


@dataclass
class Membership:
    """One subscription a churner opened and closed."""

    user: str
    k: int
    process: str
    joined: float  # perf_counter at the ``subscribed`` reply
    left: float  # perf_counter at the ``unsubscribed`` reply


@dataclass
class Told:
    """One join or leave a watcher was told."""

    user: str
    client: str
    kind: str  # "join" | "leave"
    at: float


@dataclass
class WatcherRow:
    """What one watcher was told of one phase's churn."""

    process: str
    joins: int
    leaves: int
    expected: int  # memberships performed (each owes one join and one leave)
    memberships_seen: int  # distinct member ids told
    joins_without_leave: int
    leaves_without_join: int
    churners_complete: int  # churners every membership of which it saw
    delay_ms: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class PhaseRow:
    """One phase."""

    phase: str
    processes: int
    churners: int
    hold_s: float
    seconds: float
    memberships: int
    joins_leaves_per_s: float
    drain_s: float  # the last membership's close to the watchers' last frame
    #: the last membership's close to the presence document counting the watchers only
    presence_settled_s: float
    gateway_cpu_s: float
    gateway_cpu_us_per_change: float
    #: each gateway process's CPU during the churn, in cores (1.0: one core all the time)
    gateway_cores: dict[str, float]
    client_cores: float  # this client process's, during the churn
    redis_cpu_s: float
    client_cpu_s: float
    machine_busy_s: float
    loadavg: str
    watchers: list[WatcherRow]
    probes: int
    #: what each watcher was told of the probes' memberships (held ``probe_hold_s``)
    probe_watchers: list[WatcherRow]
    probe_hold_s: float


def _frame(obj: dict[str, Any]) -> str:
    return orjson.dumps(obj).decode()


async def _reply(ws: ClientConnection, op: str) -> None:
    """Wait for the frame ``op`` (a churner gets nothing else: no presence, no publishes)."""
    while True:
        frame = orjson.loads(await ws.recv())
        if frame["op"] == op:
            return
        if frame["op"] == "error":
            raise RuntimeError(f"churner refused: {frame}")


async def _churn(
    user: str,
    sockets: list[tuple[str, ClientConnection]],
    topic: str,
    start: int,
    hold: float,
    until: float,
    out: list[Membership],
) -> None:
    k = 0
    while time.perf_counter() < until:
        process, ws = sockets[(start + k) % len(sockets)]
        await ws.send(_frame({"op": "subscribe", "topic": topic}))
        await _reply(ws, "subscribed")
        joined = time.perf_counter()
        if hold:
            await asyncio.sleep(hold)
        await ws.send(_frame({"op": "unsubscribe", "topic": topic}))
        await _reply(ws, "unsubscribed")
        out.append(Membership(user, k, process, joined, time.perf_counter()))
        k += 1


async def _probe(
    name: str,
    sides: list[tuple[str, GatewayProcess]],
    open_ws: Callable[[GatewayProcess, str], Any],
    start: int,
    topic: str,
    hold: float,
    until: float,
    out: list[Membership],
) -> None:
    """A churner whose every membership is told apart: a socket of its own
    whose token's ``sub`` (the member's ``user``) is ``NAME.K``."""
    k = 0
    while time.perf_counter() < until:
        process, gw = sides[(start + k) % len(sides)]
        user = f"{name}.{k}"
        async with open_ws(gw, user) as ws:
            await ws.send(_frame({"op": "subscribe", "topic": topic}))
            await _reply(ws, "subscribed")
            joined = time.perf_counter()
            await asyncio.sleep(hold)
            await ws.send(_frame({"op": "unsubscribe", "topic": topic}))
            await _reply(ws, "unsubscribed")
            out.append(Membership(user, 0, process, joined, time.perf_counter()))
        k += 1


class Watcher:
    """A ``/ws/`` subscription with ``presence: true`` that records what it is told."""

    def __init__(self, process: str, ws: ClientConnection) -> None:
        self.process = process
        self.ws = ws
        self.told: list[Told] = []
        self.last = time.perf_counter()
        self.task: asyncio.Task[None] | None = None

    async def start(self, topic: str) -> None:
        await self.ws.send(_frame({"op": "subscribe", "topic": topic, "presence": True}))
        await _reply(self.ws, "subscribed")
        first = orjson.loads(await self.ws.recv())
        assert first["op"] == "presence", first
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            frame = orjson.loads(await self.ws.recv())
            now = time.perf_counter()
            op = frame["op"]
            if op in ("join", "leave"):
                pairs = [(op, frame)]
            elif op == "presence":
                pairs = [("join", m) for m in frame["joins"]]
                pairs += [("leave", m) for m in frame["leaves"]]
            else:
                continue
            for kind, m in pairs:
                if not m["user"].startswith("w-"):  # the other watcher is no churn
                    self.told.append(Told(m["user"], m["client"], kind, now))
            self.last = now

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await self.ws.close()


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 0.5) * 1000,
        "p99": percentile(values, 0.99) * 1000,
        "max": max(values) * 1000 if values else float("nan"),
    }


def judge(watcher: Watcher, memberships: list[Membership]) -> WatcherRow:
    """Count what ``watcher`` was told of ``memberships`` (their users' frames);
    delays where matchable."""
    users = {m.user for m in memberships}
    told = [t for t in watcher.told if t.user in users]
    by_client: dict[str, dict[str, float]] = {}
    order: dict[str, list[str]] = {}  # user -> member ids in the order first told
    for t in told:
        seen = by_client.get(t.client)
        if seen is None:
            seen = by_client[t.client] = {}
            order.setdefault(t.user, []).append(t.client)
        seen.setdefault(t.kind, t.at)
    done: dict[str, list[Membership]] = {}
    for m in memberships:
        done.setdefault(m.user, []).append(m)
    delays: dict[str, list[float]] = {
        "join_same": [],
        "join_other": [],
        "leave_same": [],
        "leave_other": [],
    }
    complete = 0
    for user, mine in done.items():
        clients = order.get(user, [])
        if len(clients) != len(mine):
            continue  # some missed: which member id was which membership is unknown
        complete += 1
        for m, client in zip(sorted(mine, key=lambda m: m.k), clients, strict=True):
            where = "same" if m.process == watcher.process else "other"
            seen = by_client[client]
            if "join" in seen:
                delays[f"join_{where}"].append(seen["join"] - m.joined)
            if "leave" in seen:
                delays[f"leave_{where}"].append(seen["leave"] - m.left)
    return WatcherRow(
        process=watcher.process,
        joins=sum(1 for t in told if t.kind == "join"),
        leaves=sum(1 for t in told if t.kind == "leave"),
        expected=len(memberships),
        memberships_seen=len(by_client),
        joins_without_leave=sum(1 for s in by_client.values() if "leave" not in s),
        leaves_without_join=sum(1 for s in by_client.values() if "join" not in s),
        churners_complete=complete,
        delay_ms={k: _ms(v) for k, v in delays.items() if v},
    )


def _redis_pids() -> list[int]:
    return pids_named("redis-server")


async def _presence_count(gw: GatewayProcess, topic: str, token: str) -> int:
    status, doc = await ahttp("GET", f"{gw.http}/api/topics/{topic}/presence", token)
    assert status == 200, doc
    return int(doc["count"])


async def phase(
    name: str,
    gateways: dict[str, GatewayProcess],
    admin: str,
    churners: int,
    seconds: float,
    hold: float,
    probes: int = 0,
    probe_hold: float = 0.0,
) -> PhaseRow:
    """One phase on ``gateways`` (one or two processes, by name): a fresh topic."""
    topic = f"presence{uuid.uuid4().hex[:8]}"
    for gw in gateways.values():  # each answers at once; settings are shared anyway
        status, doc = await ahttp(
            "PATCH", f"{gw.http}/api/topics/{topic}", admin, {"presence": True}
        )
        assert status == 200, doc
    scopes = [f"subscribe:{topic}"]

    def open_ws(gw: GatewayProcess, user: str) -> Any:
        token = mint(user, scopes, ttl=3600)
        return connect(f"{gw.ws}/ws/", additional_headers={"Authorization": f"Bearer {token}"})

    names = list(gateways)
    watchers = [Watcher(p, await open_ws(gateways[p], f"w-{p}")) for p in names]
    for w in watchers:
        await w.start(topic)
    # On one process both of a churner's sockets are on it: the same work, told at once.
    sides = names if len(names) == 2 else names * 2
    sockets = [[(p, await open_ws(gateways[p], f"c{i}")) for p in sides] for i in range(churners)]
    await asyncio.sleep(1.5)  # the other watcher's join told; Redis written
    each = {p: gw.proc.pid for p, gw in gateways.items() if gw.proc is not None}
    pids = list(each.values())
    redis = _redis_pids() if len(names) == 2 else []
    me = [os.getpid()]
    each0 = {p: cpu_of([pid]) for p, pid in each.items()}
    cpu0, redis0, client0 = cpu_of(pids), cpu_of(redis), cpu_of(me)
    busy0, load = machine_busy_seconds(), loadavg()

    memberships: list[Membership] = []
    probed: list[Membership] = []
    started = time.perf_counter()
    until = started + seconds
    probing = asyncio.gather(
        *(
            _probe(f"p{i}", [(p, gateways[p]) for p in sides], open_ws, i, topic, probe_hold,
                   until, probed)
            for i in range(probes)
        )
    )  # fmt: skip
    await asyncio.gather(
        *(_churn(f"c{i}", sockets[i], topic, i, hold, until, memberships) for i in range(churners))
    )
    # The rate and the cores are the churners' time: a probe may hold on after it.
    ended = time.perf_counter()
    cores = {p: (cpu_of([pid]) - each0[p]) / (ended - started) for p, pid in each.items()}
    client_cores = (cpu_of(me) - client0) / (ended - started)
    await probing
    finished = time.perf_counter()  # every membership closed
    # Until the presence document counts the watchers alone (Redis caught up
    # with the leaves) and the watchers have been told nothing for QUIET.
    settled: float | None = None
    while time.perf_counter() - finished < DRAIN_MAX:
        if settled is None:
            count = await _presence_count(gateways[names[0]], topic, admin)
            if count == len(watchers):
                settled = time.perf_counter() - finished
        if settled is not None and time.perf_counter() - max(w.last for w in watchers) > QUIET:
            break
        await asyncio.sleep(0.1)
    drain = max(w.last for w in watchers) - finished
    cpu, redis_cpu, client = cpu_of(pids) - cpu0, cpu_of(redis) - redis0, cpu_of(me) - client0
    busy = machine_busy_seconds() - busy0
    for w in watchers:
        await w.stop()
    for pair in sockets:
        for _, ws in pair:
            await ws.close()
    changes = 2 * len(memberships)
    return PhaseRow(
        phase=name,
        processes=len(names),
        churners=churners,
        hold_s=hold,
        seconds=ended - started,
        memberships=len(memberships),
        joins_leaves_per_s=changes / (ended - started),
        drain_s=drain,
        presence_settled_s=float("nan") if settled is None else settled,
        gateway_cpu_s=cpu,
        gateway_cpu_us_per_change=cpu / changes * 1e6 if changes else float("nan"),
        gateway_cores=cores,
        client_cores=client_cores,
        redis_cpu_s=redis_cpu,
        client_cpu_s=client,
        machine_busy_s=busy,
        loadavg=load,
        watchers=[judge(w, memberships) for w in watchers],
        probes=probes,
        probe_watchers=[judge(w, probed) for w in watchers] if probes else [],
        probe_hold_s=probe_hold,
    )


@contextlib.contextmanager
def _deployment(
    env: dict[str, str], var: Path, names: list[str]
) -> Iterator[dict[str, GatewayProcess]]:
    gateways = {p: GatewayProcess(env, var, name=p) for p in names}
    try:
        for gw in gateways.values():
            gw.start()
        yield gateways
    finally:
        for gw in gateways.values():
            gw.stop()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    reason = postgres_unavailable()
    if reason:
        raise SystemExit(reason)
    var = Path(tempfile.mkdtemp(prefix="leasecast-bench-presence-"))
    rows: list[PhaseRow] = []
    with postgres_database(var) as env:
        env["GATEWAY_SIGNING_KEY"] = TEST_SIGNING_KEY
        admin = GatewayProcess(env, var).issue_token("admin", name="bench")
        with _deployment(env, var, ["one"]) as gateways:
            rows.append(
                await phase(
                    "one", gateways, admin, args.churners, args.seconds, 0.0, args.probes, args.hold
                )
            )
            _print(rows[-1])
        redis_env = {
            **env,
            "REDIS_URL": args.redis,
            "GATEWAY_REDIS_PREFIX": f"lcbp{uuid.uuid4().hex[:8]}",
        }
        with _deployment(redis_env, var, ["a", "b"]) as gateways:
            rows.append(
                await phase(
                    "two", gateways, admin, args.churners, args.seconds, 0.0, args.probes, args.hold
                )
            )
            _print(rows[-1])
            if args.hold > 0:
                rows.append(
                    await phase(
                        "two, held", gateways, admin, args.held_churners, args.seconds, args.hold
                    )
                )
                _print(rows[-1])
    return {"rows": [asdict(r) for r in rows]}


def _print(row: PhaseRow) -> None:
    print(
        f"{row.phase:>10}: {row.memberships:,} memberships in {row.seconds:.1f} s, "
        f"{row.joins_leaves_per_s:,.0f} joins+leaves/s, "
        f"gateways {row.gateway_cpu_us_per_change:,.0f} us CPU each "
        f"(client {row.client_cpu_s:.1f} s, redis {row.redis_cpu_s:.1f} s, "
        f"machine {row.machine_busy_s:.1f} s busy), load {row.loadavg}"
    )
    shares = ", ".join(f"{p} {c:.2f}" for p, c in row.gateway_cores.items())
    print(f"{'':>12}cores during the churn: gateway {shares}, client {row.client_cores:.2f}")
    labelled = [("churn", w) for w in row.watchers] + [("probes", w) for w in row.probe_watchers]
    for what, w in labelled:
        delays = ", ".join(
            f"{k} p50 {v['p50']:.1f} p99 {v['p99']:.1f} ms (n={v['n']:.0f})"
            for k, v in w.delay_ms.items()
        )
        print(
            f"{'':>12}{what}, watcher on {w.process}: {w.joins:,} joins, {w.leaves:,} leaves "
            f"told of {w.expected:,} each; {w.memberships_seen:,} member ids, "
            f"{w.joins_without_leave} without leave, {w.leaves_without_join} without join; "
            f"churners complete {w.churners_complete}; {delays or 'no delays'}"
        )
    print(
        f"{'':>12}last frame {row.drain_s:.2f} s after the last close; "
        f"presence document settled after {row.presence_settled_s:.2f} s"
    )


def summary(rows: list[dict[str, Any]]) -> str:
    """The table docs/benchmarks.md shows: per phase and watcher, the churn's
    counts, and the delays of the churn (or, where the churn's memberships
    cannot be matched, of the probes beside it)."""
    lines = [
        "| phase | joins+leaves/s | gateway CPU per join/leave | watcher on | joins told | "
        "leaves told | delays of | join p50 / p99 | leave p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        where = "other" if r["processes"] == 2 else "same"
        probes = r["probe_watchers"] or [None] * len(r["watchers"])
        for w, p in zip(r["watchers"], probes, strict=True):
            d, of = w["delay_ms"], "churn"
            if not d and p is not None:
                d, of = p["delay_ms"], f"probes ({p['expected']})"

            def pair(key: str, d: dict[str, Any] = d) -> str:
                v = d.get(key)
                return "-" if v is None else f"{v['p50']:.1f} / {v['p99']:.1f} ms"

            lines.append(
                f"| {r['phase']} | {r['joins_leaves_per_s']:,.0f} | "
                f"{r['gateway_cpu_us_per_change']:,.0f} us | {w['process']} | "
                f"{w['joins']:,} of {w['expected']:,} | {w['leaves']:,} of {w['expected']:,} | "
                f"{of}, {where} process | {pair('join_' + where)} | {pair('leave_' + where)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.presence", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="churn time per phase")
    parser.add_argument("--churners", type=int, default=8)
    parser.add_argument(
        "--hold",
        type=float,
        default=0.75,
        help="seconds each membership is held in the last phase (0: no such phase)",
    )
    parser.add_argument("--held-churners", type=int, default=32, help="churners of the held phase")
    parser.add_argument(
        "--probes", type=int, default=2, help="held churners beside the fast ones (delays)"
    )
    parser.add_argument("--redis", default=REDIS_URL)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    data = asyncio.run(run(args))
    print()
    print(summary(data["rows"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2))


if __name__ == "__main__":
    main()
