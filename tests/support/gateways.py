"""Gateway deployments for the tests: real gateway processes, two on one Redis, haproxy.

A :class:`GatewayProcess` is the gateway as an operator runs it (``python -m
gateway.serve``, daphne or uvicorn) on a free loopback port, with its own
``var/`` directory and log; :func:`gateways_on_redis` starts two sharing topics
through Redis; :class:`Balancer` puts haproxy in front of some. The databases
they run on come from :mod:`tests.support.databases`; clients that talk to
them from :mod:`tests.support.clients`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from tests.support.databases import ROOT, django_alias, manage, sqlite_database
from tests.support.waiting import WAIT_TIMEOUT

T = TypeVar("T")

__all__ = [
    "DAPHNE",
    "SERVERS",
    "UVICORN",
    "Balancer",
    "GatewayProcess",
    "both_servers",
    "default_server",
    "free_port",
    "gateways_on_redis",
    "haproxy_path",
    "haproxy_unavailable",
]

# daphne as `make run` starts it (gateway/server/serve.py).
DAPHNE = (sys.executable, "-m", "gateway.serve")
UVICORN = (
    sys.executable,
    "-m",
    "uvicorn",
    "gateway.asgi:application",
    "--host",
    "127.0.0.1",
    "--ws",
    "websockets",
    "--lifespan",
    "off",
    "--log-level",
    "warning",
    "--ws-max-size",
    str(8 * 1024 * 1024),
)


# The ASGI servers the gateway is tested under. A test runs under daphne unless
# it (or its fixture) asks for another; LEASECAST_TEST_SERVER=uvicorn runs every
# gateway that does not name its server under uvicorn (the whole suite, by hand).
SERVERS = ("daphne", "uvicorn")


# Runs a test under each server, each with its own module-scoped ``gateway``
# (conftest.py ``gateway_server``). The full suite runs under daphne; the tests
# marked with this are the uvicorn subset of `make test` (docs/operations.md).
both_servers = pytest.mark.parametrize("gateway_server", SERVERS, indirect=True)


def default_server() -> str:
    """The server of a gateway that does not name one: ``$LEASECAST_TEST_SERVER`` or daphne."""
    server = os.environ.get("LEASECAST_TEST_SERVER", "daphne")
    if server not in SERVERS:
        raise ValueError(f"LEASECAST_TEST_SERVER={server!r}: not one of {SERVERS}")
    return server


def free_port() -> int:
    """A TCP port on loopback that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _PortTaken(RuntimeError):
    """The server could not bind its port: something else took it after it was chosen."""


def listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` (or a child of it) listens on TCP ``port``.

    True where /proc cannot tell (not Linux): then /healthz alone decides.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            return True  # not Linux: trust /healthz alone
        for row in rows:
            fields = row.split()
            # local address "ADDR:PORT" in hex, state 0A = LISTEN, inode in field 9
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return False
    wanted = {f"socket:[{inode}]" for inode in inodes}
    return any(_holds(p, wanted) for p in (pid, *_children(pid)))


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "PID (COMM) STATE PPID ...": COMM may hold spaces, so split after it
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _holds(pid: int, sockets: set[str]) -> bool:
    """Whether process ``pid`` has one of ``sockets`` (``socket:[INODE]``) open."""
    try:
        return any(os.readlink(fd) in sockets for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


class GatewayProcess:
    """One daphne process serving ``gateway.asgi`` on a free loopback port."""

    def __init__(
        self, env: dict[str, str], var_dir: Path, name: str = "gw", server: str | None = None
    ) -> None:
        self.server = server or default_server()
        self.env = dict(env)
        self.var_dir = var_dir
        self.name = name
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = var_dir / f"{name}-{self.port}.log"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, timeout: float = WAIT_TIMEOUT) -> None:
        """Start the server and wait until ``/healthz`` answers from this process.

        The port was free when it was chosen; in a parallel run another test
        may take it before the server binds it. Then the server exits saying
        so, and a first start tries again on another free port (three tries);
        a restart keeps its port (its clients reconnect to it).
        """
        tries = 3 if self.proc is None else 1
        for attempt in range(tries):
            try:
                self._start_once(timeout)
                return
            except _PortTaken:
                if attempt == tries - 1:
                    raise
                self.port = free_port()
                self.log_path = self.var_dir / f"{self.name}-{self.port}.log"

    def _start_once(self, timeout: float) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process owns it
        self.proc = subprocess.Popen(
            self.command(),
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log_path.read_text(errors="replace")
                if "address already in use" in text.lower():
                    raise _PortTaken(self.port)
                raise RuntimeError(f"gateway exited: {text[-3000:]}")
            # Only once this process holds the port: /healthz could be
            # answered by another test's gateway that took it first.
            if listens(self.proc.pid, self.port):
                try:
                    with urllib.request.urlopen(f"{self.http}/healthz", timeout=1) as response:
                        if response.status == 200:
                            return
                except (urllib.error.URLError, ConnectionError, OSError):
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway did not become healthy: {self.log_path.read_text()[-3000:]}")

    def command(self) -> list[str]:
        """The server's command line."""
        if self.server == "uvicorn":
            # As docs/operations.md says to run it: gateway.serve gives uvicorn
            # the frame limit, heartbeats (GATEWAY_PING_*) and shutdown grace.
            return [
                *DAPHNE,
                "--server",
                "uvicorn",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "--log-level",
                "warning",
                "gateway.asgi:application",
            ]
        return [*DAPHNE, "-b", "127.0.0.1", "-p", str(self.port), "gateway.asgi:application"]

    def kill(self) -> None:
        """``kill -9``: no shutdown of any kind."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """A polite stop, then a hard one."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def manage(self, *args: str) -> str:
        """``manage.py`` against this gateway's database."""
        return manage(self.env, *args)

    def on_database(self, work: Callable[[str], T]) -> T:
        """``work(alias)`` on this gateway's database, from the test process
        (:func:`on_database`)."""
        return on_database(self.env, work)

    def issue_token(self, *scopes: str, name: str = "test") -> str:
        """A token with ``scopes``, as ``manage.py issue_token`` issues it.

        Written from this process (:func:`issue_token_here`) where it can
        reach the gateway's database (a test process: Django set up with the
        gateway's settings); else (a benchmark) by the command itself.
        """
        from django.apps import apps
        from django.conf import settings

        if (
            apps.ready
            and settings.SETTINGS_MODULE == "gateway.settings"
            and self.env.get("DJANGO_SETTINGS_MODULE") == "gateway.settings"
            and ("DATABASE_URL" in self.env or "GATEWAY_SQLITE_PATH" in self.env)
        ):
            return issue_token_here(self.env, list(scopes), name)
        args = [arg for scope in scopes for arg in ("--scope", scope)]
        return self.manage("issue_token", name, *args).strip().splitlines()[-1]

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def on_database(env: dict[str, str], work: Callable[[str], T]) -> T:
    """``work(alias)`` with a Django connection alias of this test process on
    the database ``env`` selects: what a ``manage.py shell -c`` would do,
    without starting a Django process for it (about 1.5 s of CPU each).

    On a thread of its own, as the ORM must be: a caller may be a coroutine.
    """

    def run() -> T:
        with django_alias(env, "direct") as alias:
            return work(alias)

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(run).result()


def issue_token_here(env: dict[str, str], scopes: list[str], name: str) -> str:
    """A token with ``scopes`` in the database ``env`` selects, written by
    this process (:func:`on_database`) as ``manage.py issue_token`` writes
    it (``Token.issue``). ``test_access.py`` and the docs' command tests run
    the command itself.
    """
    from gateway.core.scopes import parse_scope
    from gateway.models import Token

    for scope in scopes:
        parse_scope(scope)
    return on_database(env, lambda alias: Token.issue(name, scopes, using=alias)[1])


@contextmanager
def sqlite_gateway(name: str) -> Iterator[GatewayProcess]:
    """A started gateway process on a fresh SQLite database of its own (in a
    temporary ``var/``), stopped at the end."""
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-{name}-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name=name)
        gateway.start()
        try:
            yield gateway
        finally:
            gateway.stop()


@contextmanager
def gateways_on_redis(
    var: Path, redis_url: str, **settings: str
) -> Iterator[tuple[GatewayProcess, GatewayProcess, str]]:
    """Gateways A and B sharing topics through ``redis_url``, and an admin token.

    Each has its own SQLite file (docs/operations.md: never two processes on
    one file) holding the same token; the Redis groups are this call's own, so
    other runs on the same Redis do not interfere. ``settings`` are extra
    environment variables of both processes (``GATEWAY_BLOCK_WAIT=...``).
    """
    with sqlite_database(var) as env:
        token = issue_token_here(env, ["admin"], "pair")
        env.update(REDIS_URL=redis_url, GATEWAY_REDIS_PREFIX=f"lct{uuid.uuid4().hex[:8]}")
        env.update(settings)
        b_file = var / "b.sqlite3"
        with (
            closing(sqlite3.connect(env["GATEWAY_SQLITE_PATH"])) as source,
            closing(sqlite3.connect(b_file)) as target,
        ):
            source.backup(target)  # B's own database, with the same token
        a = GatewayProcess(env, var, name="a")
        b = GatewayProcess({**env, "GATEWAY_SQLITE_PATH": str(b_file)}, var, name="b")
        a.start()
        try:
            b.start()
            yield a, b, token
        finally:
            a.stop()
            b.stop()


def haproxy_path() -> str | None:
    """haproxy's executable: on PATH, or Debian's /usr/sbin (not on a user's PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


def haproxy_unavailable() -> str | None:
    """Why haproxy cannot be started here (not installed), or None."""
    if haproxy_path() is None:
        return "haproxy is not installed (`make balancer` installs Debian's package)"
    return None


class Balancer:
    """haproxy in front of gateway processes, on a free loopback port, from a generated config.

    WebSockets pass through (HTTP mode upgrades them), each server is checked
    with ``GET /healthz`` every ``check_ms``, and a connection a server refuses
    is retried on another (``option redispatch``), as a deployment would.
    A stats page on its own port tells which servers haproxy sees as up.
    """

    def __init__(
        self, servers: list[GatewayProcess], var_dir: Path, name: str = "lb", check_ms: int = 200
    ) -> None:
        self.servers = servers
        self.var_dir = var_dir
        self.name = name
        self.check_ms = check_ms
        self.port = free_port()
        self.stats_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.config_path = var_dir / f"{name}-{self.port}.cfg"
        self.log_path = var_dir / f"{name}-{self.port}.log"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def config(self) -> str:
        """The haproxy configuration: one frontend, the gateways, a stats page."""
        return haproxy_config(
            bind=f"127.0.0.1:{self.port}",
            servers=[(gw.name, f"127.0.0.1:{gw.port}") for gw in self.servers],
            check_host="127.0.0.1",
            check_ms=self.check_ms,
            stats=f"127.0.0.1:{self.stats_port}",
        )

    def start(self, timeout: float = 30.0) -> None:
        """Start haproxy and wait until it sees every server up."""
        self.config_path.write_text(self.config())
        haproxy = haproxy_path() or "haproxy"
        check = subprocess.run(
            [haproxy, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config: {check.stdout}{check.stderr}")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child process owns it
        self.proc = subprocess.Popen(
            [haproxy, "-db", "-f", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT
        )
        self.wait_until({gw.name: "UP" for gw in self.servers}, timeout)

    def states(self) -> dict[str, str]:
        """Each server's status as haproxy sees it (``UP``, ``DOWN``, ``UP 1/2``...)."""
        url = f"http://127.0.0.1:{self.stats_port}/stats;csv"
        with urllib.request.urlopen(url, timeout=2) as response:
            lines = response.read().decode().splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            row["svname"]: row["status"]
            for row in rows
            if row.get("pxname") == "gateways" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_until(self, wanted: dict[str, str], timeout: float = 30.0) -> None:
        """Wait until haproxy reports each named server in the wanted status."""
        deadline = time.monotonic() + timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited: {self.log_path.read_text()[-3000:]}")
            try:
                states = self.states()
            except (urllib.error.URLError, ConnectionError, OSError):
                states = {}
            if all(states.get(name) == status for name, status in wanted.items()):
                return
            time.sleep(0.05)
        raise RuntimeError(f"haproxy did not report {wanted} (last: {states})")

    def stop(self) -> None:
        """Stop haproxy (SIGTERM, then SIGKILL)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def haproxy_config(
    *, bind: str, servers: list[tuple[str, str]], check_host: str, check_ms: int, stats: str
) -> str:
    """One haproxy configuration for every test deployment: a frontend at
    ``bind``, the gateways ``(name, address:port)`` checked on /healthz every
    ``check_ms``, and a stats page at ``stats``."""
    lines = "\n".join(f"    server {name} {address} check" for name, address in servers)
    ms = check_ms
    return f"""\
global
    # two descriptors per connection: within a default 20,000 descriptor limit
    maxconn 4000

defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    # an upgraded WebSocket lives as long as its client
    timeout tunnel 1h
    timeout http-keep-alive 5s
    # a connection a stopping server refuses goes to another one
    retries 3
    option redispatch 1

frontend gateways
    bind {bind}
    default_backend gateways

backend gateways
    balance leastconn
    option httpchk
    http-check send meth GET uri /healthz ver HTTP/1.1 hdr Host {check_host}
    http-check expect status 200
    default-server inter {ms}ms fastinter {ms}ms downinter {ms}ms fall 2 rise 2
{lines}

listen stats
    bind {stats}
    stats enable
    stats uri /stats
"""
