"""``make demo`` (``python -m gateway.demo``): the whole system alive on one machine.

On the embedded default (SQLite, in-memory channel layer), in a database of
its own (``var/demo.sqlite3``, migrated and given an admin login and token
in ``var/demo-credentials.txt`` on first use), so nothing ``make run`` left
in ``var/leasecast.sqlite3`` shows up in the demo and the demo leaves nothing
there (``make reset`` forgets both), it starts:

- the gateway (``python -m gateway.serve``), as its own process;
- a Spark feed (``python -m spark_feed``, Spark's rate source) into the queue
  ``demo.orders``, when Java and pyspark are there; otherwise a plain producer
  takes its place, and the demo says why;
- three workers on ``demo.orders``: *steady* (acks at once), *slow* (half a
  second a message) and *crashy* (drops its socket mid-lease every so often,
  as a crashed process does, so its leases come back with ``deliveries`` 2);
  a poison message every ten seconds that no worker can handle is nacked
  until it is dead-lettered;
- a publisher on the topic ``demo.prices`` and three subscribers, one per
  policy: *fast* (``drop_oldest``, priority 2), *slow* (``drop_newest``, a
  buffer of 20, reads 2 a second: it drops, and its dashboard row turns red)
  and *careful* (``block``, keeps up).

It prints the dashboard's address and login, a status line every five
seconds, and on Ctrl-C (or SIGTERM) stops the clients, then the Spark feed,
then the gateway, and exits 0. The admin token reaches the Spark feed
through its environment (``LEASECAST_TOKEN``), never its command line, where
``ps`` would show it to every user of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from leasecast import Producer, Subscriber, Worker
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from gateway.conf import BASE_DIR, var_dir

#: The checkout, with manage.py (not this module's parent: it is gateway/site/).
ROOT = BASE_DIR
QUEUE = "demo.orders"
TOPIC = "demo.prices"


@dataclass(frozen=True)
class Credentials:
    """What ``manage.py bootstrap_dev`` wrote to the demo's credentials file."""

    token: str
    login: str | None

    @classmethod
    def read(cls, path: Path) -> Credentials:
        """The development token and login kept in ``path``.

        Raises:
            SystemExit: there is no such file, or no token in it.
        """
        if not path.exists():
            raise SystemExit(f"{path} not found: manage.py bootstrap_dev did not write it")
        token, login = None, None
        for line in path.read_text().splitlines():
            label, _, value = line.strip().partition(":")
            if label == "admin token":
                token = value.strip()
            elif label == "admin login":
                login = value.strip()
        if not token:
            raise SystemExit(f"no admin token in {path}")
        return cls(token, login)


def demo_environment(database: Path) -> dict[str, str]:
    """This process's environment, pointed at the demo's own SQLite database."""
    env = dict(os.environ)
    # The demo is the embedded default: never a DATABASE_URL the shell had set.
    env.pop("DATABASE_URL", None)
    env["GATEWAY_SQLITE_PATH"] = str(database)
    return env


def prepare(env: dict[str, str], url: str, credentials: Path) -> Credentials:
    """Migrate the demo's database and make its admin (first run only).

    Raises:
        SystemExit: ``manage.py`` failed (its output says why).
    """
    for args in (
        ["migrate", "--noinput", "-v0"],
        ["bootstrap_dev", "--url", url, "--credentials", str(credentials)],
    ):
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"manage.py {args[0]} failed:\n{done.stdout}{done.stderr}")
    return Credentials.read(credentials)


class Child:
    """A child process in its own session, its output in a log file.

    Its own session keeps a terminal's Ctrl-C away from it, so the demo can
    stop its parts in order (clients, feed, gateway).
    """

    def __init__(self, name: str, command: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> None:
        """Ask it to stop with ``sig``; kill its whole group if it does not."""
        if not self.running():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def spark_missing() -> str | None:
    """Why the Spark feed cannot run here, or None."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    if shutil.which("java") is None:
        return "no Java on PATH (Spark needs Java 17)"
    return None


def get_json(url: str, token: str) -> Any:
    """One authenticated GET."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def wait_healthy(url: str, child: Child, timeout: float = 60) -> None:
    """Block until the gateway's ``/healthz`` answers.

    Raises:
        SystemExit: it exited or did not answer in time (its log says why).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.running():
            raise SystemExit(f"the gateway exited; see {child.log}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.2)
    raise SystemExit(f"the gateway did not answer within {timeout:.0f} s; see {child.log}")


class Demo:
    """The clients of the demo, as asyncio tasks, and their tallies."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.ws = "ws" + url.removeprefix("http")
        self.token = token
        self.tally: Counter[str] = Counter()

    # -- workers

    async def worker(self, name: str, prefetch: int, seconds: float) -> None:
        """Ack every order after ``seconds``; nack poison until it is dead-lettered."""
        async with Worker(self.ws, QUEUE, token=self.token, prefetch=prefetch) as worker:
            async for delivery in worker:
                if seconds:
                    await asyncio.sleep(seconds)
                if isinstance(delivery.body, dict) and delivery.body.get("poison"):
                    await delivery.nack(delay=0.5)  # max_deliveries dead-letters it
                    self.tally["poison nacked"] += 1
                    continue
                await delivery.ack()
                self.tally[f"{name} acked"] += 1

    async def crashy_worker(self) -> None:
        """A worker that drops its socket mid-lease, like a crashing process."""
        path = f"{self.ws}/ws/queues/{QUEUE}/?prefetch=10"
        headers = {"Authorization": f"Bearer {self.token}"}
        while True:
            try:
                async with connect(path, additional_headers=headers) as conn:
                    async for text in conn:
                        frame = json.loads(text)
                        if frame.get("op") != "deliver":
                            continue
                        body = frame.get("body")
                        if isinstance(body, dict) and body.get("poison"):
                            await conn.send(json.dumps({"op": "nack", "receipt": frame["receipt"]}))
                            continue
                        if random.random() < 0.03:
                            # No close frame, no ack: the gateway releases every
                            # lease of the socket at once (docs/protocol.md, Worker socket).
                            conn.transport.abort()
                            self.tally["crashy crashed"] += 1
                            break
                        await conn.send(json.dumps({"op": "ack", "receipt": frame["receipt"]}))
                        self.tally["crashy acked"] += 1
            except (OSError, ConnectionClosed, InvalidHandshake):
                pass
            await asyncio.sleep(1)  # "restarting the process"

    # -- producers

    async def orders(self, per_second: float) -> None:
        """Orders into the queue, when Spark does not feed it."""
        async with Producer(self.url, token=self.token) as producer:
            n = 0
            while True:
                n += 1
                await producer.enqueue(
                    QUEUE, {"order": n, "amount": round(random.uniform(1, 99), 2)}
                )
                await asyncio.sleep(1 / per_second)

    async def poison(self) -> None:
        """A message no worker can handle, every ten seconds."""
        async with Producer(self.url, token=self.token) as producer:
            n = 0
            while True:
                n += 1
                await producer.enqueue(QUEUE, {"poison": True, "n": n})
                await asyncio.sleep(10)

    async def prices(self, per_second: float) -> None:
        """A random walk published to the topic."""
        price = 1.09
        async with Producer(self.url, token=self.token) as producer:
            while True:
                price = round(price * (1 + random.gauss(0, 0.0005)), 5)
                await producer.publish(TOPIC, {"pair": "EURUSD", "price": price})
                self.tally["published"] += 1
                await asyncio.sleep(1 / per_second)

    # -- subscribers

    async def subscriber(self, name: str, seconds: float, **options: Any) -> None:
        """Read the topic, ``seconds`` a message."""
        async with Subscriber(self.ws, TOPIC, token=self.token, **options) as sub:
            async for _ in sub:
                self.tally[f"{name} received"] += 1
                self.tally[f"{name} dropped"] = sub.dropped
                if seconds:
                    await asyncio.sleep(seconds)

    def tasks(self, feed_orders: bool, rate: float) -> list[asyncio.Task[None]]:
        """Start every client."""
        roles = [
            self.worker("steady", prefetch=20, seconds=0),
            self.worker("slow", prefetch=5, seconds=0.5),
            self.crashy_worker(),
            self.poison(),
            self.prices(20),
            self.subscriber("fast", 0, on_full="drop_oldest", capacity=100, priority=2),
            self.subscriber("slow", 0.5, on_full="drop_newest", capacity=20, credit=5),
            self.subscriber("careful", 0, on_full="block", capacity=1000),
        ]
        if feed_orders:
            roles.append(self.orders(rate))
        return [asyncio.create_task(self._forever(role)) for role in roles]

    async def _forever(self, role: Any) -> None:
        # A client that fails is reported once, not retried in a tight loop:
        # the demo is for looking at, and a dying client is worth seeing.
        try:
            await role
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            print(f"[demo] a client stopped: {type(exc).__name__}: {exc}", flush=True)

    def status(self) -> str:
        """One line: the queue, the workers, the topic and its subscribers."""
        try:
            stats = get_json(f"{self.url}/api/queues/{QUEUE}", self.token)
            queue = (
                f"{QUEUE}: {stats['visible']} visible, {stats['in_flight']} in flight, "
                f"{stats['dead']} dead"
            )
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            queue = f"{QUEUE}: (no answer)"
        t = self.tally
        return (
            f"[demo] {queue} | acked: steady {t['steady acked']}, slow {t['slow acked']}, "
            f"crashy {t['crashy acked']} (crashed {t['crashy crashed']}x) | "
            f"{TOPIC}: published {t['published']}; fast {t['fast received']}, "
            f"slow {t['slow received']} (dropped {t['slow dropped']}), "
            f"careful {t['careful received']}"
        )


async def run_clients(demo: Demo, feed_orders: bool, rate: float, stop: asyncio.Event) -> None:
    """The clients and the status line, until ``stop`` is set."""
    tasks = demo.tasks(feed_orders, rate)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 5)
            if not stop.is_set():
                print(await asyncio.to_thread(demo.status), flush=True)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m gateway.demo``."""
    parser = argparse.ArgumentParser(prog="python -m gateway.demo", description=__doc__)
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument(
        "--rate", type=float, default=20.0, help="orders per second into the queue (default 20)"
    )
    parser.add_argument("--no-spark", action="store_true", help="feed orders without Spark")
    parser.add_argument(
        "--database",
        type=Path,
        help="the demo's own SQLite file (default: demo.sqlite3 in var/, never make run's)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the demo until Ctrl-C or SIGTERM."""
    args = build_parser().parse_args(argv)
    var = var_dir()
    var.mkdir(parents=True, exist_ok=True)
    database = args.database or var / "demo.sqlite3"
    url = f"http://127.0.0.1:{args.port}"
    env = demo_environment(database)
    credentials = prepare(env, url, var / "demo-credentials.txt")
    children: list[Child] = []
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        gateway = Child(
            "gateway",
            [sys.executable, "-m", "gateway.serve", "-b", "127.0.0.1", "-p", str(args.port)],
            var / "demo-gateway.log",
            env,
        )
        children.append(gateway)
        wait_healthy(url, gateway)
        why_not_spark = "--no-spark" if args.no_spark else spark_missing()
        if why_not_spark is None:
            feed = Child(
                "spark",
                [
                    sys.executable, "-m", "spark_feed", "--url", url,
                    "--queue", QUEUE, "--rate", str(max(1, int(args.rate))),
                    "--key-column", "value", "--trigger-seconds", "2",
                    "--checkpoint", str(var / "checkpoints" / "demo"),
                ],
                var / "demo-spark.log",
                # The token by environment: a command line is public (ps).
                {**env, "LEASECAST_TOKEN": credentials.token},
            )  # fmt: skip
            children.append(feed)
            feed_line = f"Spark's rate source -> {QUEUE}, {args.rate:g} rows/s ({feed.log})"
        else:
            feed_line = f"a plain producer -> {QUEUE} (no Spark feed: {why_not_spark})"
        login = credentials.login or "your admin user"
        print(
            "\nLeasecast demo is running.\n"
            f"  dashboard:  {url}/dashboard/\n"
            f"  admin:      {url}/admin/\n"
            f"  login:      {login}\n"
            f"  token:      {credentials.token}\n"
            f"  database:   {database} (its own; make reset forgets it and make run's)\n"
            f"  feed:       {feed_line}\n"
            f"  workers:    steady, slow, crashy on {QUEUE}; a poison message every 10 s\n"
            f"  topic:      {TOPIC}: fast (drop_oldest), slow (drop_newest, drops), "
            "careful (block)\n"
            f"  gateway log {gateway.log}\n"
            "Ctrl-C stops everything.\n",
            flush=True,
        )
        demo = Demo(url, credentials.token)
        loop.run_until_complete(run_clients(demo, why_not_spark is not None, args.rate, stop))
        print("[demo] stopping: clients closed", flush=True)
    finally:
        for child in reversed(children):  # the feed, then the gateway
            child.stop()
            print(f"[demo] stopped the {child.name}", flush=True)
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
