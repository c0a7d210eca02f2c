"""Topic streams benchmark: resume, history on/off, one process against two on Redis.

    python -m bench.topics                 # 10,000 missed, 100 subscribers, 3 rounds; ~5 minutes
    python -m bench.topics --quick         # tiny sizes, one round: a smoke run
    python -m bench.topics --json bench/results/topics.json

Three deployments share one PostgreSQL database (the topics' settings and the
token), started once for the whole run:

- **embedded**: one gateway process without ``REDIS_URL`` (offsets and
  history in the process);
- **redis-one**: process A with ``REDIS_URL``, publisher and subscribers on A
  (every message still goes through A's Redis stream and back);
- **redis-two**: processes A and B on the same Redis, publisher on A,
  subscribers on B (every delivery crosses processes through the stream).

Each round runs every measurement once, the arms of each comparison in a
rotated order (A,B then B,A...), and the ratios are given per round (median
and range), never as a ratio of averages over different moments:

1. **Resume**: a topic with ``history_size`` >= the missed count; a publisher
   sends N messages (pipelined) while nobody listens, then a paced live
   publisher starts and a subscriber connects with ``since``/``epoch``. Time
   from connect to the last missed message (the ``subscribed`` frame's
   offset) and to the first live one; replay messages/s; every offset checked
   exactly once and in order. Replay messages/s is the missed count over the
   time from connect to the last missed message (handshake included).
2. **History on vs off**: ``bench.fanout``'s round (N subscribers, one
   publisher pipelining 100 unconfirmed), ``history_size`` 0 (a fresh
   topic's default) against 10,000 (set with ``PATCH /api/topics/T``),
   on the embedded process and on redis-one, with the gateway's CPU per
   delivery (from /proc), which a shared machine moves less than deliveries/s.
3. **Deployments**: the same fan-out round on each deployment (deliveries/s),
   then a paced round (publishes at a fixed rate, so latency is the path, not
   a backlog): publish to ``published`` reply p50/p99 at the publisher, and
   publish to delivery p50/p99 at subscribers on the subscribing process.

With ``--channels-relay COMMIT`` (e.g. ``eb97ecc``, the last commit before
Redis Streams replaced it), part 3 also runs **channels-relay-two**: that
commit's source tree (``git archive``), two processes relaying topics through
``channels_redis`` (``group_send``), publisher on A, subscribers on B, on a
PostgreSQL database migrated by that tree, in the same rounds.

Subscribers open 10 at a time (``--connect-limit``): 100 at once on a topic
with stored settings are mostly refused "Too many connections" by a gateway
on Redis (docs/benchmarks.md, "Topic streams").

The load generator is one asyncio process beside the gateways; the machine
has 2 cores, so compare ratios within a run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from bench.fanout import Target, fanout_round
from bench.peers.leasecast import publish_all
from bench.procstat import process_cpu_seconds
from bench.workqueue import percentile
from tests.support.clients import ahttp
from tests.support.databases import PG_ADMIN_URL, ROOT, postgres_database, postgres_unavailable
from tests.support.gateways import GatewayProcess

REDIS_URL_DEFAULT = "redis://127.0.0.1:6379/0"
#: GATEWAY_QUEUE_SETTINGS_TTL of the gateway: how long another process may
#: keep a topic's old settings.
SETTINGS_TTL = 2.1


@dataclass
class SplitTarget(Target):
    """A :class:`bench.fanout.Target` whose publisher talks to another process."""

    pub_base: str = ""

    def pub_url(self) -> str:
        return f"{self.pub_base or self.base}/ws/produce/"


class TreeGateway(GatewayProcess):
    """A gateway process running the source tree ``tree`` (another commit) in this venv."""

    # The tree first on sys.path and this one off it (the cwd), so no package
    # of this tree shadows a namespace package of that one.
    BOOT = (
        "import os, runpy, sys; tree = sys.argv.pop(1); here = os.getcwd(); os.chdir(tree); "
        "sys.path[:] = [tree] + [p for p in sys.path if p not in ('', here)]; "
        "runpy.run_module('gateway.serve', run_name='__main__', alter_sys=True)"
    )

    def __init__(self, tree: Path, env: dict[str, str], var: Path, name: str, server: str) -> None:
        super().__init__({**env, "PYTHONPATH": str(tree)}, var, name=name, server=server)
        self.tree = tree

    def command(self) -> list[str]:
        command = super().command()
        assert command[1:3] == ["-m", "gateway.serve"], command
        return [command[0], "-c", self.BOOT, str(self.tree), *command[3:]]

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(self.tree / "manage.py"), *args],
            cwd=self.tree,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout


def tree_processes(
    stack: ExitStack, commit: str, redis_url: str, prefix: str, server: str, var: Path, label: str
) -> tuple[TreeGateway, TreeGateway, dict[str, str]]:
    """Processes A and B of ``commit``'s tree on one Redis (``prefix``), and their headers.

    Its own PostgreSQL database, migrated by that tree; stopped and dropped by ``stack``.
    """
    import psycopg

    tree = var / f"tree-{label}-{commit}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", commit], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    name = f"leasecast_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    stack.callback(_drop_database, name)  # after the processes stop (callbacks run LIFO)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        GATEWAY_VAR_DIR=str(var),
        DJANGO_SETTINGS_MODULE="gateway.settings",
        DATABASE_URL=PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name,
        REDIS_URL=redis_url,
        GATEWAY_REDIS_PREFIX=prefix,
    )
    a = TreeGateway(tree, env, var, f"{label}-a", server)
    b = TreeGateway(tree, env, var, f"{label}-b", server)
    a.manage("migrate", "--noinput", "-v0")
    token = a.manage("issue_token", "bench", "--scope", "admin").strip().splitlines()[-1]
    stack.callback(stop_all, (a, b))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(GatewayProcess.start, (a, b)))
    return a, b, {"Authorization": f"Bearer {token}"}


def channels_relay(
    stack: ExitStack, commit: str, redis_url: str, prefix: str, server: str, var: Path
) -> Deployment:
    """Processes A and B of ``commit``'s tree relaying topics over ``channels_redis``."""
    a, b, headers = tree_processes(stack, commit, redis_url, prefix, server, var, "relay")
    return Deployment("channels-relay-two", a, b, headers, legacy=True)


def before(
    stack: ExitStack, commit: str, redis_url: str, prefix: str, server: str, var: Path
) -> dict[str, Deployment]:
    """``commit``'s tree on Redis, as ``before-redis-one`` and ``before-redis-two``
    (the same shapes as this tree's), for resume measured before and after a change."""
    a, b, headers = tree_processes(stack, commit, redis_url, prefix, server, var, "before")
    return {
        "before-redis-one": Deployment("before-redis-one", a, a, headers),
        "before-redis-two": Deployment("before-redis-two", a, b, headers),
    }


def stop_all(processes: tuple[GatewayProcess, ...]) -> None:
    """Stop the processes together (each may wait for its graceful shutdown)."""
    with ThreadPoolExecutor(len(processes)) as pool:
        list(pool.map(GatewayProcess.stop, processes))


def _drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Deployment:
    """Where publishes go and where subscribers listen."""

    name: str
    pub: GatewayProcess
    sub: GatewayProcess
    headers: dict[str, str]
    legacy: bool = False  # another commit's tree: no topic settings API

    @property
    def token(self) -> str:
        return self.headers["Authorization"].removeprefix("Bearer ")

    def target(self) -> SplitTarget:
        return SplitTarget(self.name, self.sub.ws, self.headers, True, pub_base=self.pub.ws)


@dataclass
class ResumeRow:
    """One resume: what came back, in what order, how fast."""

    deployment: str
    missed: int  # offsets after ``since`` up to the ``subscribed`` frame's offset
    received: int  # items received in all (replay and live)
    in_order: bool  # every offset exactly once, contiguous from since + 1
    dropped: int
    recovered: bool
    subscribed_s: float  # connect to the ``subscribed`` frame
    caught_up_s: float  # connect to the last missed message
    first_live_s: float  # connect to the first live message
    replay_per_s: float  # missed / (connect to the last missed message)
    frames: int  # ``messages`` frames the replay came in
    round_no: int = 0  # ratios pair the deployments of one round


@dataclass
class FanoutRow:
    """One fan-out round (``bench.fanout.Row`` plus what was compared)."""

    arm: str
    deployment: str
    history_size: int
    subscribers: int
    messages: int
    delivered: int
    deliveries_per_s: float
    p50_ms: float
    p99_ms: float
    round_no: int = 0  # ratios pair the arms of one round
    #: CPU the gateway process(es) used in the round (connects included) per
    #: delivery: steadier than deliveries/s on a shared machine
    cpu_us_per_delivery: float = float("nan")


@dataclass
class LatencyRow:
    """One paced round: publish latencies at the publisher and at subscribers."""

    deployment: str
    rate: float
    published: int
    refused: int
    subscribers: int
    delivered: int
    reply_p50_ms: float
    reply_p99_ms: float
    delivery_p50_ms: float
    delivery_p99_ms: float


@dataclass
class Results:
    """Every row of the run."""

    resume: list[ResumeRow] = field(default_factory=list)
    history: list[FanoutRow] = field(default_factory=list)
    deployments: list[FanoutRow] = field(default_factory=list)
    latency: list[LatencyRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # measurements that failed, left out


def topic_name(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


async def set_history(d: Deployment, topic: str, size: int) -> None:
    """PATCH the topic's history_size on the publishing process (applies there at once)."""
    status, doc = await ahttp(
        "PATCH", f"{d.pub.http}/api/topics/{topic}", d.token, {"history_size": size}
    )
    if status != 200:
        raise RuntimeError(f"PATCH /api/topics/{topic}: {status} {doc}")
    if d.sub is not d.pub:
        await asyncio.sleep(SETTINGS_TTL)  # the subscribing process reads settings again


async def publish_pipelined(pub: ClientConnection, topic: str, n: int) -> dict[str, Any]:
    """Publish ``n`` messages, 100 unconfirmed at most; the last ``published`` reply."""
    return await publish_all(pub, topic, [{"m": i} for i in range(n)])


# -- 1. resume


async def resume_round(d: Deployment, missed: int, live_rate: float) -> ResumeRow:
    """Miss ``missed`` messages, resume with since/epoch, catch up, then live."""
    topic = topic_name("resume")
    # Room for what the live publisher adds before the subscriber's turn:
    # history_size exactly ``missed`` would (rightly) answer ``recovered: false``.
    await set_history(d, topic, missed + 10_000)
    async with connect(d.pub.ws + "/ws/produce/", additional_headers=d.headers) as pub:
        start = await publish_pipelined(pub, topic, 1)
        since, epoch = start["offset"], start["epoch"]
        await publish_pipelined(pub, topic, missed)  # nobody listens
        stop_live = asyncio.Event()

        async def live() -> None:
            """Paced publishes, replies read and ignored (they are in order)."""
            i, t0 = 0, time.perf_counter()
            while not stop_live.is_set():
                frame = {"op": "publish", "topic": topic, "body": {"live": i}}
                await pub.send(orjson.dumps(frame).decode())
                i += 1
                delay = t0 + i / live_rate - time.perf_counter()
                await asyncio.sleep(max(0.0, delay))

        async def drain_replies() -> None:
            with contextlib.suppress(Exception):
                async for _ in pub:
                    pass

        live_task = asyncio.create_task(live())
        replies = asyncio.create_task(drain_replies())
        url = (
            f"{d.sub.ws}/ws/topics/{topic}/?since={since}&epoch={epoch}"
            f"&capacity={missed + 20_000}&credit=1000000000"
        )
        offsets: list[int] = []
        dropped = frames = 0
        t_caught = t_live = t_sub = float("nan")
        head = since
        recovered = caught = False
        t0 = time.perf_counter()
        try:
            async with connect(url, additional_headers=d.headers, max_size=None) as sub:
                hello = orjson.loads(await asyncio.wait_for(sub.recv(), 60))
                t_sub = time.perf_counter()
                if hello.get("op") != "subscribed":
                    raise RuntimeError(f"expected subscribed, got {hello}")
                recovered, head = bool(hello["recovered"]), int(hello["offset"])
                while True:
                    frame = orjson.loads(await asyncio.wait_for(sub.recv(), 60))
                    now = time.perf_counter()
                    if frame.get("op") != "messages":
                        raise RuntimeError(f"unexpected frame {frame}")
                    dropped += int(frame.get("dropped", 0))
                    got = [int(item["offset"]) for item in frame["items"]]
                    offsets += got
                    if got and got[0] <= head:
                        frames += 1
                    if got and got[-1] >= head and not caught:
                        t_caught, caught = now, True
                    if got and got[-1] > head:
                        t_live = now
                        break
        finally:
            stop_live.set()
            await live_task
            replies.cancel()
            await asyncio.gather(replies, return_exceptions=True)
    n_missed = head - since
    expected = list(range(since + 1, since + 1 + len(offsets)))
    return ResumeRow(
        d.name,
        n_missed,
        len(offsets),
        offsets == expected,
        dropped,
        recovered,
        t_sub - t0,
        t_caught - t0,
        t_live - t0,
        n_missed / (t_caught - t0),
        frames,
    )


# -- 2 and 3. fan-out


async def fanout(
    d: Deployment,
    arm: str,
    history_size: int,
    n_subs: int,
    deliveries: int,
    connect_limit: int,
    round_no: int = 0,
) -> FanoutRow:
    topic = topic_name("fan")
    if history_size and not d.legacy:  # a fresh topic's history_size is 0
        await set_history(d, topic, history_size)
    n_msgs = max(50, deliveries // n_subs)
    processes = {d.pub, d.sub}
    cpu_before = sum(cpu_seconds(gw) for gw in processes)
    row = await fanout_round(d.target(), n_subs, n_msgs, topic=topic, connect_limit=connect_limit)
    return FanoutRow(
        arm,
        d.name,
        history_size,
        row.subscribers,
        row.messages,
        row.delivered,
        row.deliveries_per_s,
        row.p50_ms,
        row.p99_ms,
        round_no,
        (sum(cpu_seconds(gw) for gw in processes) - cpu_before) / max(1, row.delivered) * 1e6,
    )


async def latency_round(d: Deployment, rate: float, seconds: float, n_subs: int) -> LatencyRow:
    """Paced publishes on ``d.pub``; reply latency there, delivery latency on ``d.sub``."""
    topic = topic_name("lat")
    n = max(10, int(rate * seconds))
    delivery: list[float] = []
    counts = [0] * n_subs
    opened = 0
    ready, done = asyncio.Event(), asyncio.Event()

    async def subscriber(k: int) -> None:
        nonlocal opened
        url = f"{d.sub.ws}/ws/topics/{topic}/?capacity={n}&credit=1000000000"
        async with connect(url, additional_headers=d.headers, max_size=None) as ws:
            opened += 1
            if opened == n_subs:
                ready.set()
            async for text in ws:
                now = time.time()
                items = orjson.loads(text)["items"]
                delivery.extend(now - item["body"]["t"] for item in items)
                counts[k] += len(items)
                if all(c >= n for c in counts):
                    done.set()
                if counts[k] >= n:
                    return

    subs = [asyncio.create_task(subscriber(k)) for k in range(n_subs)]
    await asyncio.wait_for(ready.wait(), 60)
    await asyncio.sleep(0.5)  # every subscription registered (B follows the stream)
    sent: dict[str, float] = {}
    reply_latency: list[float] = []
    refused = 0
    async with connect(d.pub.ws + "/ws/produce/", additional_headers=d.headers) as pub:

        async def replies() -> None:
            nonlocal refused
            for _ in range(n):
                reply = orjson.loads(await pub.recv())
                now = time.perf_counter()
                if reply.get("op") != "published":
                    refused += 1
                reply_latency.append(now - sent.pop(reply["ref"]))

        reader = asyncio.create_task(replies())
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            ref = f"p{i}"
            frame = {"op": "publish", "topic": topic, "ref": ref, "body": {"t": time.time()}}
            sent[ref] = time.perf_counter()
            await pub.send(orjson.dumps(frame).decode())
        await asyncio.wait_for(reader, 60)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), 30)
    for task in subs:
        task.cancel()
    await asyncio.gather(*subs, return_exceptions=True)
    return LatencyRow(
        d.name,
        rate,
        n,
        refused,
        n_subs,
        sum(counts),
        percentile(reply_latency, 0.5) * 1000,
        percentile(reply_latency, 0.99) * 1000,
        percentile(delivery, 0.5) * 1000,
        percentile(delivery, 0.99) * 1000,
    )


# -- the run


def cpu_seconds(gw: GatewayProcess) -> float:
    """User + system CPU of the gateway process so far (all its threads)."""
    assert gw.proc is not None
    return process_cpu_seconds(gw.proc.pid)


def rotated(items: list[Any], k: int) -> list[Any]:
    """``items`` starting at position ``k`` (mod its length): each round starts elsewhere."""
    k %= len(items)
    return items[k:] + items[:k]


@contextmanager
def deployments(
    redis_url: str, server: str, channels_commit: str | None, before_commit: str | None = None
) -> Iterator[dict[str, Deployment]]:
    """The deployments, the three of this tree on one fresh PostgreSQL database.

    Their Redis keys are removed afterwards.
    """
    reason = postgres_unavailable()
    if reason:
        raise SystemExit(f"bench.topics needs PostgreSQL: {reason}")
    import redis

    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise SystemExit(f"bench.topics needs Redis at {redis_url}: {exc}") from exc
    prefix = f"lcbench{uuid.uuid4().hex[:8]}"
    var = Path(tempfile.mkdtemp(prefix="leasecast-bench-topics-"))
    with ExitStack() as stack:
        env = stack.enter_context(postgres_database(var))
        embedded = GatewayProcess(env, var, name="embedded", server=server)
        shared = {**env, "REDIS_URL": redis_url, "GATEWAY_REDIS_PREFIX": prefix}
        a = GatewayProcess(shared, var, name="a", server=server)
        b = GatewayProcess(shared, var, name="b", server=server)
        stack.callback(stop_all, (embedded, a, b))
        with ThreadPoolExecutor(4) as pool:  # together: each waits for its health check
            issued = pool.submit(embedded.issue_token, "admin", name="bench")
            list(pool.map(GatewayProcess.start, (embedded, a, b)))
            token = issued.result()
        headers = {"Authorization": f"Bearer {token}"}
        try:
            deps = {
                "embedded": Deployment("embedded", embedded, embedded, headers),
                "redis-one": Deployment("redis-one", a, a, headers),
                "redis-two": Deployment("redis-two", a, b, headers),
            }
            if channels_commit:
                deps["channels-relay-two"] = channels_relay(
                    stack, channels_commit, redis_url, f"{prefix}old", server, var
                )
            if before_commit:
                deps.update(before(stack, before_commit, redis_url, f"{prefix}before", server, var))
            yield deps
        finally:
            client = redis.Redis.from_url(redis_url)
            for pattern in (f"{prefix}:*", f"{prefix}old*", f"{prefix}before*"):
                keys = list(client.scan_iter(pattern))
                if keys:
                    client.delete(*keys)
            print(f"   logs in {var}", file=sys.stderr, flush=True)


def log(row: Any) -> None:
    print(f"   {asdict(row)}", file=sys.stderr, flush=True)


async def run(args: argparse.Namespace) -> Results:
    results = Results()
    names = ["embedded", "redis-one", "redis-two"]
    with deployments(args.redis, args.server, args.channels_relay, args.before) as deps:
        relay = ["channels-relay-two"] if args.channels_relay else []
        earlier = ["before-redis-one", "before-redis-two"] if args.before else []
        for name in (
            [] if args.quick or args.parts == ["resume"] else names + relay
        ):  # a fresh process is slower at first
            await fanout(
                deps[name], "warm-up", 0, args.subscribers, args.deliveries // 4, args.connect_limit
            )

        async def attempt(what: str, measurement: Awaitable[Row]) -> Row | None:
            """The row, or None with the failure kept for the report (the run goes on)."""
            try:
                row = await measurement
            except Exception as exc:  # a refused subscribe, a lost Redis...: say so
                results.errors.append(f"{what}: {type(exc).__name__}: {exc}")
                print(f"   FAILED {results.errors[-1]}", file=sys.stderr, flush=True)
                return None
            log(row)
            return row

        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)

            for name in rotated(names + earlier, r) if "resume" in args.parts else []:
                resumed = await attempt(
                    f"round {r + 1}, resume {name}",
                    resume_round(deps[name], args.missed, args.live_rate),
                )
                if isinstance(resumed, ResumeRow):
                    resumed.round_no = r
                    results.resume.append(resumed)
            for name in args.history_on if "history" in args.parts else []:
                for size in rotated([0, args.history], r):
                    arm = "history-on" if size else "history-off"
                    fan = await attempt(
                        f"round {r + 1}, {arm} {name}",
                        fanout(deps[name], arm, size, args.subscribers, args.deliveries,
                               args.connect_limit, r),
                    )  # fmt: skip
                    if isinstance(fan, FanoutRow):
                        results.history.append(fan)
            for name in rotated(names + relay, r) if "deployments" in args.parts else []:
                fan = await attempt(
                    f"round {r + 1}, fan-out {name}",
                    fanout(deps[name], name, 0, args.subscribers, args.deliveries,
                           args.connect_limit, r),
                )  # fmt: skip
                if isinstance(fan, FanoutRow):
                    results.deployments.append(fan)
                lat = await attempt(
                    f"round {r + 1}, paced {name}",
                    latency_round(
                        deps[name], args.paced_rate, args.paced_seconds, args.paced_subscribers
                    ),
                )
                if isinstance(lat, LatencyRow):
                    results.latency.append(lat)
    return results


Row = ResumeRow | FanoutRow | LatencyRow


# -- the report


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min-max, n=K)`` of per-round values."""
    clean = [v for v in values if v == v]
    if not clean:
        return "-"
    med = fmt.format(statistics.median(clean))
    if len(clean) == 1:
        return med
    return f"{med} ({fmt.format(min(clean))}-{fmt.format(max(clean))}, n={len(clean)})"


def paired(
    rows: list[FanoutRow], key: str, arm_of: str, value: str, base: str, other: str
) -> list[float]:
    """Per-round ratios ``other / base`` (rows of the same ``key`` and round)."""
    by: dict[tuple[Any, int, str], float] = {}
    for row in rows:
        by[(getattr(row, key), row.round_no, getattr(row, arm_of))] = getattr(row, value)
    out = []
    for k, round_no, arm in sorted(by, key=str):
        if arm == base and (k, round_no, other) in by:
            a, b = by[(k, round_no, base)], by[(k, round_no, other)]
            out.append(b / a if a else float("nan"))
    return out


def resume_ratios(rows: list[ResumeRow], base: str, other: str) -> list[float]:
    """Per-round ratios of caught-up times, ``other / base``."""
    a = {r.round_no: r.caught_up_s for r in rows if r.deployment == base}
    b = {r.round_no: r.caught_up_s for r in rows if r.deployment == other}
    return [b[k] / a[k] for k in sorted(a) if k in b and a[k]]


def report(res: Results, args: argparse.Namespace) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"\n1. Resume after {args.missed:,} missed messages (live publisher at "
        f"{args.live_rate:g}/s), median (min-max) over rounds:\n")  # fmt: skip
    add("| deployment | rounds | replayed | all in order, once | recovered | to subscribed ms "
        "| caught up ms | first live ms | replay msg/s |")  # fmt: skip
    add("|---|---:|---:|---|---|---:|---:|---:|---:|")
    for name in ("embedded", "redis-one", "redis-two", "before-redis-one", "before-redis-two"):
        rows = [r for r in res.resume if r.deployment == name]
        if not rows:
            continue
        add(
            f"| {name} | {len(rows)} | {spread([r.missed for r in rows], '{:,.0f}')} "
            f"| {all(r.in_order and r.dropped == 0 for r in rows)} "
            f"| {all(r.recovered for r in rows)} "
            f"| {spread([r.subscribed_s * 1000 for r in rows], '{:,.0f}')} "
            f"| {spread([r.caught_up_s * 1000 for r in rows], '{:,.0f}')} "
            f"| {spread([r.first_live_s * 1000 for r in rows], '{:,.0f}')} "
            f"| {spread([r.replay_per_s for r in rows], '{:,.0f}')} |"
        )
    if args.before:
        for name in ("redis-one", "redis-two"):
            ratios = resume_ratios(res.resume, f"before-{name}", name)
            add(f"\n- {name}: caught up, this tree / {args.before} = **{spread(ratios)}x** "
                "per round (below 1: faster)")  # fmt: skip
    if "history" not in args.parts and "deployments" not in args.parts:
        return "\n".join(lines)
    add(f"\n2. Fan-out, {args.subscribers} subscribers, history_size 0 against "
        f"{args.history:,} (about {args.deliveries:,} deliveries per round):\n")  # fmt: skip
    add(
        "| deployment | history_size | rounds | deliveries/s | p50 ms | p99 ms "
        "| gateway CPU us/delivery |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.history_on:
        for size in (0, args.history):
            arm = [r for r in res.history if r.deployment == name and r.history_size == size]
            add(
                f"| {name} | {size:,} | {len(arm)} "
                f"| {spread([r.deliveries_per_s for r in arm], '{:,.0f}')} "
                f"| {spread([r.p50_ms for r in arm], '{:.0f}')} "
                f"| {spread([r.p99_ms for r in arm], '{:.0f}')} "
                f"| {spread([r.cpu_us_per_delivery for r in arm], '{:.2f}')} |"
            )
    for name in args.history_on:
        both = [r for r in res.history if r.deployment == name]
        ratios = paired(both, "deployment", "arm", "deliveries_per_s", "history-off", "history-on")
        add(f"\n- {name}: history on / off = **{spread(ratios)}x** per round (target >= 0.8x)")
        cpu = paired(both, "deployment", "arm", "cpu_us_per_delivery", "history-off", "history-on")
        add(f"- {name}: gateway CPU per delivery, history on / off = {spread(cpu)}x per round")
    add(f"\n3. Deployments, fan-out to {args.subscribers} subscribers (deliveries/s), "
        f"and paced publishes ({args.paced_rate:g}/s for {args.paced_seconds:g} s, "
        f"{args.paced_subscribers} subscribers on the subscribing process):\n")  # fmt: skip
    add("| deployment | deliveries/s | flat-out p50 / p99 ms | publish->published p50 / p99 ms "
        "| publish->delivery p50 / p99 ms | refused |")  # fmt: skip
    add("|---|---:|---:|---:|---:|---:|")
    for name in ("embedded", "redis-one", "redis-two", "channels-relay-two"):
        fan = [r for r in res.deployments if r.deployment == name]
        lat = [r for r in res.latency if r.deployment == name]
        if not fan:
            continue
        add(
            f"| {name} | {spread([r.deliveries_per_s for r in fan], '{:,.0f}')} "
            f"| {spread([r.p50_ms for r in fan], '{:.0f}')} / "
            f"{spread([r.p99_ms for r in fan], '{:.0f}')} "
            f"| {spread([r.reply_p50_ms for r in lat], '{:.1f}')} / "
            f"{spread([r.reply_p99_ms for r in lat], '{:.1f}')} "
            f"| {spread([r.delivery_p50_ms for r in lat], '{:.1f}')} / "
            f"{spread([r.delivery_p99_ms for r in lat], '{:.1f}')} "
            f"| {sum(r.refused for r in lat)} |"
        )
    add("")
    for other in ("redis-one", "redis-two"):
        ratios = paired(
            res.deployments, "subscribers", "arm", "deliveries_per_s", "embedded", other
        )
        add(f"- deliveries/s {other} / embedded: **{spread(ratios)}x** per round")
    ratios = paired(res.deployments, "subscribers", "arm", "deliveries_per_s", "redis-one",
                    "redis-two")  # fmt: skip
    add(f"- deliveries/s redis-two / redis-one: **{spread(ratios)}x** per round")
    if args.channels_relay:
        ratios = paired(res.deployments, "subscribers", "arm", "deliveries_per_s",
                        "channels-relay-two", "redis-two")  # fmt: skip
        add(
            f"- deliveries/s redis-two / channels-relay-two ({args.channels_relay}): "
            f"**{spread(ratios)}x** per round"
        )
    short: list[Any] = [
        r for r in res.history + res.deployments if r.delivered < r.subscribers * r.messages
    ]
    short += [r for r in res.latency if r.delivered < r.subscribers * r.published]
    if short:
        add(f"\nINCOMPLETE rounds (fewer deliveries than sent): {short}")
    if res.errors:
        add("\nERRORS (these measurements failed and are left out):\n")
        lines.extend(f"- {e}" for e in res.errors)
    bad = [r for r in res.resume if not (r.in_order and r.recovered and r.dropped == 0)]
    if bad:
        add(f"\nRESUME PROBLEMS: {bad}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.topics", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--missed", type=int, default=10_000, help="messages a resume misses")
    parser.add_argument("--history", type=int, default=10_000, help="history_size when on")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument(
        "--deliveries", type=int, default=200_000, help="per fan-out round, all subscribers"
    )
    parser.add_argument("--live-rate", type=float, default=200.0, help="publishes/s during resume")
    parser.add_argument("--paced-rate", type=float, default=200.0, help="publishes/s")
    parser.add_argument("--paced-seconds", type=float, default=5.0)
    parser.add_argument("--paced-subscribers", type=int, default=10)
    parser.add_argument("--history-on", default="embedded,redis-one",
                        help="deployments of the history on/off comparison")  # fmt: skip
    parser.add_argument("--server", default="daphne", choices=("daphne", "uvicorn"))
    parser.add_argument(
        "--connect-limit",
        type=int,
        default=10,
        help="subscriber handshakes at once (0: all at once; see docs/benchmarks.md)",
    )
    parser.add_argument("--redis", default=REDIS_URL_DEFAULT)
    parser.add_argument(
        "--channels-relay",
        metavar="COMMIT",
        help="also run this commit's channels_redis topic relay (two processes) in part 3",
    )
    parser.add_argument(
        "--before",
        metavar="COMMIT",
        help="also resume on this commit's tree on Redis (one process and two), same rounds",
    )
    parser.add_argument(
        "--parts",
        default="resume,history,deployments",
        help="which measurements (comma-separated): resume, history, deployments",
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if args.quick:
        args.rounds, args.missed, args.subscribers, args.deliveries = 1, 500, 10, 2_000
        args.paced_seconds = min(args.paced_seconds, 1.0)
        args.paced_subscribers = min(args.paced_subscribers, 2)
    args.history_on = [x for x in args.history_on.split(",") if x]
    started, load_before = time.time(), Path("/proc/loadavg").read_text().split()[:3]
    res = asyncio.run(run(args))
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(report(res, args))
    print(f"\n({time.time() - started:.0f} s; load average {' '.join(load_before)} before, "
          f"{' '.join(load_after)} after)")  # fmt: skip
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, **asdict(res)}, indent=2
            )
        )


if __name__ == "__main__":
    main()
