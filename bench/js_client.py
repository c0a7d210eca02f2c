"""JavaScript client benchmark: ``leasecast.js`` in Chromium against the Python ``Subscriber``.

    python -m bench.js_client                 # 3 rounds per client, about a minute
    python -m bench.js_client --quick         # a smoke run, well under a minute
    python -m bench.js_client --messages 50000 --missed 10000 --rounds 5 --json out.json

One daphne gateway on SQLite (as ``make run`` starts it). Rounds rotate the
clients (JS then Python, then Python then JS, ...), after one small unmeasured
round each. The JS client runs in one page of Debian's Chromium, loaded from
the gateway's ``/static/leasecast/leasecast.js``; the Python
``leasecast.Subscriber`` runs in one process of its own (as the browser is),
for the whole benchmark. Each round uses a fresh topic with ``history_size``
20,000 and measures, with one subscription of one client:

- **throughput**: the subscriber counts ``--messages`` messages while this
  process publishes them as fast as the gateway takes them: HTTP batches of
  ``--batch`` (``POST /api/topics/T/messages``), ``--posters`` requests in
  flight. The subscriber's buffer holds every message (``capacity`` =
  messages + 1,000, ``drop_oldest``) and both clients use their default
  credit window (256). Reported: messages/s received (first publish to the
  last message counted by the subscriber) and the publisher's rate (first to
  last accepted batch): a received/publisher ratio near 1 means the publisher
  (the gateway's intake) was the limit, not the client.
- **forced resume**: the gateway closes the subscriber's socket (the
  dashboard's ``disconnect``, close code 4000, as an operator would); the
  client reconnects by itself after its backoff (``--backoff`` ms ceiling, so
  the delay is at least half of it: long enough to publish the ``--missed``
  messages meanwhile) and resumes from the offset and epoch it kept. From the
  new socket's open: time to the first missed message, to the last, and to
  the first live one (a ticker publishes one every 5 ms from the end of the
  missed batch). A run whose reconnect opened before the missed batch was
  all published is counted as not valid.
- **reopen resume**: the subscription is closed by the page/program, its
  position (``epoch``, ``offset``) kept; ``--missed`` messages are published;
  a new subscription starts with ``since``/``epoch``. From the call that
  starts it (before its socket): time to the socket's open, the first missed
  message, the last, and the first live one (the ticker runs from the start).

The **replay** rate is the missed messages over the time from the first one
received to the last: the client's receive rate when the publisher is not the
limit (the gateway reads them from the topic's history). The offsets received
are checked throughout: no gap, no duplicate, and the gateway said the
position was recovered.

Both clients stamp times with the system clock (``performance.timeOrigin +
performance.now()`` in the page, ``time.time()`` in Python; the Python
reconnect's open is stamped by a subclass of ``Subscriber`` around its
reconnect method, as it has no callback for it), so times from different
processes compare. The machine is shared: each measurement records ``/proc/loadavg``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.procstat import loadavg

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
]
CLIENTS = ("js", "python")
MODES = ("forced", "reopen")
HISTORY = 20_000
TICK = 0.005  # seconds between live messages during a resume


def browser_missing() -> str | None:
    """Why the JS client cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM}"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed"
    return None


@dataclass
class Throughput:
    """One subscriber receiving ``messages`` published as fast as the gateway takes them."""

    client: str
    round: int
    messages: int
    received_per_s: float
    published_per_s: float
    dropped: int
    in_order: bool
    loadavg: str


@dataclass
class Resume:
    """One resume after ``missed`` messages were published while the subscriber was away.

    Times are from the new socket's open (``forced``) or from the call that
    starts the new subscription (``reopen``); ``to_open_s`` is the backoff
    waited after the gateway's close (``forced``) or the time to open.
    """

    client: str
    round: int
    mode: str
    missed: int
    to_open_s: float
    to_first_s: float
    to_last_missed_s: float
    to_first_live_s: float
    recovered: bool
    in_order: bool
    valid: bool
    loadavg: str

    @property
    def replay_per_s(self) -> float:
        """Missed messages per second, from the first one received to the last."""
        return self.missed / max(self.to_last_missed_s - self.to_first_s, 1e-6)


# ------------------------------------------------------------------ page ----

PAGE_SETUP = """
async ([token]) => {
  const lc = await import("/static/leasecast/leasecast.js");
  const now = () => performance.timeOrigin + performance.now();
  window.bench = {
    // One subscription that counts what it receives, stamped with the system clock.
    start(topic, opts) {
      const s = {n: 0, last: null, firstMissedAt: null, lastMissedAt: null, firstLive: null,
                 prev: opts.since ?? null, lastMissed: opts.lastMissed ?? null,
                 inOrder: true, dropped: 0, recovered: true, started: now(), opens: [],
                 error: null};
      window.bench.state = s;
      const onError = (e) => { s.error = String(e); };
      const backoff = {initial: opts.backoff, max: opts.backoff};
      const client = new lc.Leasecast(location.origin, {token, onError, backoff});
      window.bench.client = client;
      window.bench.sub = client.subscribe(topic, {
        capacity: opts.capacity, onFull: "drop_oldest",
        since: opts.since ?? undefined, epoch: opts.epoch ?? undefined,
        onRecover: (info) => { if (!info.recovered) s.recovered = false; },
        onDrop: (n) => { s.dropped += n; },
        onStateChange: (state) => { if (state === "open") s.opens.push(now()); },
        onMessage: (m) => {
          const t = now();
          s.n += 1;
          if (s.prev !== null && m.offset !== s.prev + 1) s.inOrder = false;
          s.prev = m.offset;
          if (s.n === opts.count) s.last = t;
          if (s.lastMissed !== null) {
            if (m.offset === s.lastMissed - opts.missed + 1) s.firstMissedAt = t;
            if (m.offset === s.lastMissed) s.lastMissedAt = t;
            if (m.offset > s.lastMissed && s.firstLive === null) s.firstLive = t;
          }
        },
      });
      return s.started;
    },
    async stop() {
      const position = window.bench.sub.position;
      await window.bench.client.close();
      return position;
    },
  };
  return lc.VERSION;
}
"""

TIMES = ("last", "firstMissedAt", "lastMissedAt", "firstLive", "started")


class Client(Protocol):
    """One subscription at a time of one client (the JS page or the Python process)."""

    name: str

    async def start(self, topic: str, spec: dict[str, Any]) -> float:
        """Subscribe (``spec``: count, capacity, backoff, since, epoch, lastMissed, missed)."""

    async def caught_up(self, timeout: float) -> dict[str, Any]:
        """Wait until ``count`` messages were received; the state then."""

    async def expect(self, last_missed: int) -> None:
        """Tell the subscription which offset is the last missed one."""

    async def finished(self, timeout: float) -> dict[str, Any]:
        """Wait for the first live message, close; the state, with ``position``."""


class JsClient:
    """The JS client in one Chromium page of the gateway's origin."""

    name = "js"

    def __init__(self, page: Any) -> None:
        self.page = page

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, http: str, token: str) -> AsyncIterator[JsClient]:
        from playwright.async_api import async_playwright

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                # A document of the gateway's origin (loopback sockets from a
                # page Playwright answered itself are refused by Chromium).
                await page.goto(f"{http}/healthz")
                await page.evaluate(PAGE_SETUP, [token])
                yield cls(page)
                if errors:
                    raise RuntimeError(f"page errors: {errors}")
            finally:
                await browser.close()

    async def start(self, topic: str, spec: dict[str, Any]) -> float:
        started: float = await self.page.evaluate(
            "([t, o]) => window.bench.start(t, o)", [topic, spec]
        )
        return started / 1000

    async def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = await self.page.evaluate("window.bench.state")
        if state["error"]:
            raise RuntimeError(f"the JS client reported: {state['error']}")
        for key in TIMES:
            if state.get(key) is not None:
                state[key] = state[key] / 1000
        state["opens"] = [t / 1000 for t in state["opens"]]
        return state

    async def _until(self, key: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (state := await self._state())[key] is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"JS page: no {key} after {timeout} s ({state['n']} received)")
            await asyncio.sleep(0.02)
        return state

    async def caught_up(self, timeout: float) -> dict[str, Any]:
        return await self._until("last", timeout)

    async def expect(self, last_missed: int) -> None:
        await self.page.evaluate("(x) => { window.bench.state.lastMissed = x; }", last_missed)

    async def finished(self, timeout: float) -> dict[str, Any]:
        state = await self._until("firstLive", timeout)
        state["position"] = await self.page.evaluate("window.bench.stop()")
        return state


# ---------------------------------------------------------- python child ----


def _stdin_line() -> str:
    return sys.stdin.readline()


async def child_main() -> None:
    """The Python subscriber's process: one run per JSON line on stdin, JSON lines on stdout.

    One process for the whole benchmark, as one browser page: each run is
    warm, like a reconnect.
    """
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, _stdin_line):
        await child_run(json.loads(line))


def _say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


async def child_run(spec: dict[str, Any]) -> None:
    """One subscription of the Python subscriber's process (see :class:`JsClient`'s page)."""
    from leasecast import Subscriber

    loop = asyncio.get_running_loop()
    s: dict[str, Any] = {
        "n": 0,
        "last": None,
        "firstMissedAt": None,
        "lastMissedAt": None,
        "firstLive": None,
        "prev": spec.get("since"),
        "lastMissed": spec.get("lastMissed"),
        "inOrder": True,
        "started": time.time(),
        "opens": [],
    }
    _say("started", at=s["started"])
    backoff = spec["backoff"] / 1000

    class Stamped(Subscriber):
        """Stamps each reconnect's open: Subscriber has no callback for it."""

        async def _reconnect_with_backoff(self) -> None:
            await super()._reconnect_with_backoff()
            s["opens"].append(time.time())

    sub = Stamped(
        spec["url"],
        spec["topic"],
        token=spec["token"],
        capacity=spec["capacity"],
        on_full="drop_oldest",
        backoff_initial=backoff,
        backoff_max=backoff,
        since=spec.get("since"),
        epoch=spec.get("epoch"),
    )

    async def read_expect() -> None:
        line = await loop.run_in_executor(None, _stdin_line)
        s["lastMissed"] = json.loads(line)["lastMissed"]

    tasks: list[asyncio.Task[None]] = []
    async with sub:
        s["opens"].append(time.time())
        async for message in sub:
            t = time.time()
            offset = message.offset
            s["n"] += 1
            if s["prev"] is not None and offset != s["prev"] + 1:
                s["inOrder"] = False
            s["prev"] = offset
            if s["n"] == spec["count"]:
                s["last"] = t
                s["dropped"] = sub.dropped
                _say("caught_up", state=s)
                tasks.append(asyncio.create_task(read_expect()))
            last_missed = s["lastMissed"]
            if last_missed is not None and offset is not None:
                if offset == last_missed - spec["missed"] + 1:
                    s["firstMissedAt"] = t
                if offset == last_missed:
                    s["lastMissedAt"] = t
                if offset > last_missed:
                    s["firstLive"] = t
                    break
        for task in tasks:
            task.cancel()
        s["recovered"] = sub.gaps == 0
        s["dropped"] = sub.dropped
        s["position"] = {"epoch": sub.position.epoch, "offset": s["prev"]}
    _say("done", state=s)


class PythonClient:
    """The Python ``Subscriber`` in a child process (a process of its own, as the browser)."""

    name = "python"

    def __init__(self, ws: str, token: str, proc: asyncio.subprocess.Process) -> None:
        self.ws = ws
        self.token = token
        self.proc = proc

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, ws: str, token: str) -> AsyncIterator[PythonClient]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.js_client",
            "--child",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            yield cls(ws, token, proc)
        finally:
            if proc.returncode is None:
                assert proc.stdin is not None
                proc.stdin.close()  # the child's loop ends at the end of its input
                try:
                    await asyncio.wait_for(proc.wait(), 5)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()

    async def _send(self, frame: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(frame).encode() + b"\n")
        await self.proc.stdin.drain()

    async def _until(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
            if not line:
                raise RuntimeError("the Python subscriber's process exited")
            answer: dict[str, Any] = json.loads(line)
            if answer["event"] == event:
                return answer

    async def start(self, topic: str, spec: dict[str, Any]) -> float:
        await self._send({"url": self.ws, "topic": topic, "token": self.token, **spec})
        return float((await self._until("started", 30))["at"])

    async def caught_up(self, timeout: float) -> dict[str, Any]:
        state: dict[str, Any] = (await self._until("caught_up", timeout))["state"]
        return state

    async def expect(self, last_missed: int) -> None:
        await self._send({"lastMissed": last_missed})

    async def finished(self, timeout: float) -> dict[str, Any]:
        state: dict[str, Any] = (await self._until("done", timeout))["state"]
        return state


# ------------------------------------------------------------- publisher ----


def carries(socket: dict[str, Any], topic: str) -> bool:
    """A socket of ``/api/stats`` subscribed to ``topic``: a subscriber socket, or a
    multiplexed one (the JavaScript client's default) carrying it."""
    if socket["kind"] == "multiplex":
        return any(t.get("topic") == topic for t in socket.get("topics", []))
    return bool(socket["kind"] == "subscriber" and socket.get("topic") == topic)


async def subscribed(gateway: Any, admin: str, topic: str, timeout: float = 30) -> None:
    """Wait until the gateway lists a socket subscribed to ``topic``."""
    from tests.support.clients import ahttp

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, stats = await ahttp("GET", f"{gateway.http}/api/stats", admin)
        if status == 200 and any(carries(s, topic) for s in stats["sockets"]):
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"no subscriber of {topic} after {timeout} s")


async def publish_batches(
    gateway: Any, admin: str, topic: str, n: int, batch: int, posters: int
) -> tuple[float, float]:
    """Publish ``n`` messages in HTTP batches, ``posters`` in flight; (start, end) times."""
    from tests.support.clients import ahttp

    url = f"{gateway.http}/api/topics/{topic}/messages"
    batches = [list(range(i, min(i + batch, n))) for i in range(0, n, batch)]
    # Batches in flight together may be taken in either order: subscribers
    # are checked on offsets (gapless, increasing), not on the bodies' numbers.
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)

    async def poster() -> None:
        while not queue.empty():
            items = queue.get_nowait()
            body = {"messages": [{"body": {"i": i}} for i in items]}
            status, reply = await ahttp("POST", url, admin, body)
            if status != 200:
                raise RuntimeError(f"publish answered {status}: {reply}")

    start = time.time()
    await asyncio.gather(*(poster() for _ in range(posters)))
    return start, time.time()


@contextlib.asynccontextmanager
async def ticker(gateway: Any, admin: str, topic: str) -> AsyncIterator[None]:
    """Publish one live message every ``TICK`` seconds until the block exits."""
    from tests.support.clients import Socket

    async with await Socket.open(f"{gateway.ws}/ws/produce/", admin) as producer:
        stop = asyncio.Event()

        async def run() -> None:
            k = 0
            while not stop.is_set():
                await producer.request({"op": "publish", "topic": topic, "body": {"live": k}})
                k += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), TICK)

        task = asyncio.create_task(run())
        try:
            yield
        finally:
            stop.set()
            await task


async def topic_with_history(gateway: Any, admin: str) -> str:
    from tests.support.clients import ahttp

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    status, doc = await ahttp(
        "PATCH", f"{gateway.http}/api/topics/{topic}", admin, {"history_size": HISTORY}
    )
    if status != 200:
        raise RuntimeError(f"PATCH /api/topics/{topic} answered {status}: {doc}")
    return topic


async def topic_offset(gateway: Any, admin: str, topic: str) -> int:
    """The topic's latest offset."""
    from tests.support.clients import ahttp

    status, doc = await ahttp("GET", f"{gateway.http}/api/topics/{topic}", admin)
    if status != 200:
        raise RuntimeError(f"GET /api/topics/{topic} answered {status}: {doc}")
    return int(doc["offset"])


async def force_disconnect(gateway: Any, admin: str, topic: str) -> float:
    """Have the gateway close the topic's subscriber socket (code 4000); when it answered."""
    from tests.support.clients import Socket, ahttp

    status, stats = await ahttp("GET", f"{gateway.http}/api/stats", admin)
    assert status == 200, stats
    (sock,) = [s for s in stats["sockets"] if carries(s, topic)]
    async with await Socket.open(f"{gateway.ws}/ws/dashboard/", admin) as dashboard:
        reply = await dashboard.request(
            {"op": "disconnect", "process": sock["process"], "socket": sock["id"]}
        )
    if reply.get("op") != "disconnected":
        raise RuntimeError(f"dashboard disconnect answered {reply}")
    return time.time()


# ----------------------------------------------------------------- rounds ----


async def one_round(
    client: Client, gateway: Any, admin: str, args: argparse.Namespace, rnd: int
) -> tuple[Throughput, list[Resume]]:
    """Throughput, then a forced resume, then a reopen resume, on a fresh topic."""
    topic = await topic_with_history(gateway, admin)
    n, missed = args.messages, args.missed
    common = {"capacity": n + 1000, "backoff": args.backoff, "missed": missed}

    load = loadavg()
    await client.start(topic, {**common, "count": n})
    await subscribed(gateway, admin, topic)
    pub_start, pub_end = await publish_batches(gateway, admin, topic, n, args.batch, args.posters)
    state = await client.caught_up(args.timeout)
    through = Throughput(
        client.name,
        rnd,
        n,
        n / (state["last"] - pub_start),
        n / (pub_end - pub_start),
        state["dropped"],
        state["inOrder"],
        load,
    )

    # Forced: the gateway closes the socket; the client comes back by itself.
    load = loadavg()
    await client.expect(state["prev"] + missed)
    closed = await force_disconnect(gateway, admin, topic)
    _, missed_end = await publish_batches(gateway, admin, topic, missed, args.batch, args.posters)
    async with ticker(gateway, admin, topic):
        state = await client.finished(args.timeout)
    opened = state["opens"][-1]
    forced = Resume(
        client.name,
        rnd,
        "forced",
        missed,
        opened - closed,
        state["firstMissedAt"] - opened,
        state["lastMissedAt"] - opened,
        state["firstLive"] - opened,
        bool(state["recovered"]),
        state["inOrder"],
        # Every missed message published before the new socket opened, and one reconnect.
        missed_end < opened and len(state["opens"]) == 2,
        load,
    )

    # Reopen: closed by the client, position kept, a new subscription from it.
    load = loadavg()
    position = state["position"]
    await publish_batches(gateway, admin, topic, missed, args.batch, args.posters)
    last_missed = await topic_offset(gateway, admin, topic)
    spec = {
        **common,
        "count": 0,
        "since": position["offset"],
        "epoch": position["epoch"],
        "lastMissed": last_missed,
        # The ticker's messages after the first live one are missed too.
        "missed": last_missed - position["offset"],
    }
    async with ticker(gateway, admin, topic):
        started = await client.start(topic, spec)
        state = await client.finished(args.timeout)
    opened = state["opens"][0]
    reopen = Resume(
        client.name,
        rnd,
        "reopen",
        spec["missed"],
        opened - started,
        state["firstMissedAt"] - started,
        state["lastMissedAt"] - started,
        state["firstLive"] - started,
        bool(state["recovered"]),
        state["inOrder"],
        len(state["opens"]) == 1,
        load,
    )
    return through, [forced, reopen]


def show(t: Throughput, resumes: list[Resume]) -> str:
    """One line for one client's round."""
    parts = [
        f"round {t.round} {t.client:6}: received {t.received_per_s:7,.0f}/s "
        f"(publisher {t.published_per_s:7,.0f}/s, dropped {t.dropped}, in order {t.in_order})"
    ]
    for r in resumes:
        parts.append(
            f"{r.mode} {r.missed:,}: open {r.to_open_s * 1000:.0f}, first "
            f"{r.to_first_s * 1000:.0f}, last {r.to_last_missed_s * 1000:.0f}, live "
            f"{r.to_first_live_s * 1000:.0f} ms (recovered {r.recovered}, in order "
            f"{r.in_order}, valid {r.valid})"
        )
    parts.append(f"load {t.loadavg}")
    return "; ".join(parts)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.gateways import sqlite_gateway

    throughput: list[Throughput] = []
    resumes: list[Resume] = []
    with sqlite_gateway("bench-jsclient") as gateway:
        admin = gateway.issue_token("admin", name="bench")
        async with (
            JsClient.open(gateway.http, admin) as js,
            PythonClient.open(gateway.ws, admin) as py,
        ):
            clients: tuple[Client, Client] = (js, py)
            # One small unmeasured round each: the gateway's first
            # publishes and a client's first messages are slower (imports,
            # JIT, SQLite pages).
            small = {"messages": min(2000, args.messages), "missed": min(1000, args.missed)}
            warm = argparse.Namespace(**(vars(args) | small))
            for client in clients:
                await one_round(client, gateway, admin, warm, -1)
            for rnd in range(args.rounds):
                for client in clients if rnd % 2 == 0 else clients[::-1]:
                    t, rs = await one_round(client, gateway, admin, args, rnd)
                    throughput.append(t)
                    resumes.extend(rs)
                    print(show(t, rs), flush=True)
    return {
        "throughput": [asdict(t) for t in throughput],
        "resume": [asdict(r) | {"replay_per_s": r.replay_per_s} for r in resumes],
    }


def spread(values: list[float], digits: int = 0) -> str:
    """Median and (min-max) of ``values``."""
    if not values:
        return "-"
    f = f",.{digits}f"
    return f"{statistics.median(values):{f}} ({min(values):{f}}-{max(values):{f}})"


def table(data: dict[str, Any]) -> str:
    """Medians per client, with (min-max), and the JS/Python ratios of each round."""
    rows = [
        "| client | received msg/s | publisher msg/s | received / publisher | dropped "
        "| out of order |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for client in CLIENTS:
        t = [x for x in data["throughput"] if x["client"] == client]
        if t:
            rows.append(
                f"| {client} | {spread([x['received_per_s'] for x in t])} "
                f"| {spread([x['published_per_s'] for x in t])} "
                f"| {spread([x['received_per_s'] / x['published_per_s'] for x in t], 2)} "
                f"| {sum(x['dropped'] for x in t)} | {sum(not x['in_order'] for x in t)} |"
            )
    rows += [
        "",
        "| resume | client | missed | open ms | first missed ms | last missed ms "
        "| first live ms | replay msg/s | valid runs | gaps or duplicates |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in MODES:
        for client in CLIENTS:
            r = [x for x in data["resume"] if x["client"] == client and x["mode"] == mode]
            ok = [x for x in r if x["valid"]]
            if not r:
                continue
            bad = sum(not (x["in_order"] and x["recovered"]) for x in r)
            rows.append(
                f"| {mode} | {client} | {spread([x['missed'] for x in ok])} "
                f"| {spread([x['to_open_s'] * 1000 for x in ok])} "
                f"| {spread([x['to_first_s'] * 1000 for x in ok])} "
                f"| {spread([x['to_last_missed_s'] * 1000 for x in ok])} "
                f"| {spread([x['to_first_live_s'] * 1000 for x in ok])} "
                f"| {spread([x['replay_per_s'] for x in ok])} "
                f"| {len(ok)}/{len(r)} | {bad} |"
            )
    ratios: dict[str, list[float]] = {"received msg/s": []}
    by = {(x["client"], x["round"]): x for x in data["throughput"]}
    for (client, rnd), x in by.items():
        if client == "js" and ("python", rnd) in by:
            ratios["received msg/s"].append(
                x["received_per_s"] / by[("python", rnd)]["received_per_s"]
            )
    rby = {(x["client"], x["mode"], x["round"]): x for x in data["resume"] if x["valid"]}
    for (client, mode, rnd), x in sorted(rby.items()):
        y = rby.get(("python", mode, rnd))
        if client != "js" or y is None:
            continue
        for name, key in (
            ("last missed", "to_last_missed_s"),
            ("first live", "to_first_live_s"),
            ("replay msg/s", "replay_per_s"),
        ):
            ratios.setdefault(f"{mode} resume: {name}", []).append(x[key] / y[key])
    rows += ["", "JS / Python, per round: median (min-max)", ""]
    for name, values in ratios.items():
        rows.append(f"- {name}: {spread(values, 2)}x")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its tables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.js_client", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--messages", type=int, default=50_000, help="per throughput run")
    parser.add_argument("--missed", type=int, default=10_000, help="published while away")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each client")
    parser.add_argument("--batch", type=int, default=1000, help="messages per HTTP publish")
    parser.add_argument("--posters", type=int, default=2, help="HTTP publishes in flight")
    parser.add_argument(
        "--backoff", type=int, default=3000, help="reconnect backoff ceiling, ms (both clients)"
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds for one run")
    parser.add_argument(
        "--quick", action="store_true", help="5,000 messages, 2,000 missed, 1 round"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        asyncio.run(child_main())
        return
    missing = browser_missing()
    if missing:
        sys.exit(f"cannot run the JS client: {missing}")
    if args.quick:
        args.messages, args.missed, args.rounds = 5_000, 2_000, 1
    if args.missed + 1000 > HISTORY:
        sys.exit(f"--missed must leave room in the history ({HISTORY:,} messages)")
    started = time.time()
    load_before = loadavg()
    data = asyncio.run(run(args))
    print(
        f"\nJS client (Chromium) against Python Subscriber, {args.messages:,} messages a "
        f"throughput run (HTTP batches of {args.batch}, {args.posters} in flight), resumes of "
        f"{args.missed:,} missed, {args.rounds} rounds each, one daphne gateway (SQLite):\n"
    )
    print(table(data))
    print(
        f"\nload average before {load_before}, after {loadavg()} "
        f"({os.cpu_count()} cores); {time.time() - started:.0f} s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}} | data))


if __name__ == "__main__":
    main()
