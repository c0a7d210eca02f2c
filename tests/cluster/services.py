"""The servers of a deployment on separate hosts (tests/cluster/netns.py), started by the tests.

- :class:`Postgres`: a PostgreSQL cluster of the machine's own binaries
  (``/usr/lib/postgresql/*/bin``), on a data directory of its own, run as the
  ``postgres`` user on a database host; a primary, or a streaming standby made
  with ``pg_basebackup`` from one.
- :class:`Redis`: ``redis-server`` on a Redis host, without persistence.
- :class:`Gateway`: ``python -m gateway.serve`` on a gateway host.
- :class:`Balancer`: Debian's haproxy on a balancer host in front of the gateways.
- :func:`open_socket` and :func:`request`: a client's WebSocket and HTTP
  request, made from inside the client host.

Every server listens on its host's address only; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import glob
import pwd
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from websockets.asyncio.client import connect

from tests.cluster.netns import Host
from tests.support.clients import Socket, http
from tests.support.databases import ROOT, base_env
from tests.support.gateways import haproxy_config, haproxy_path

__all__ = [
    "Balancer",
    "Gateway",
    "Postgres",
    "Redis",
    "Sentinel",
    "open_socket",
    "postgres_bin",
    "request",
    "servers_unavailable",
]

GATEWAY_PORT = 8000
BALANCER_PORT = 8000


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/VERSION/bin`` holding ``postgres`` and ``initdb``."""
    found = [
        Path(d)
        for d in glob.glob("/usr/lib/postgresql/*/bin")
        if Path(d, "postgres").exists() and Path(d, "initdb").exists()
    ]
    return max(found, key=lambda d: int(d.parent.name), default=None) if found else None


def servers_unavailable() -> str | None:
    """Why the deployment's servers cannot be started here, or None."""
    if postgres_bin() is None:
        return "no PostgreSQL binaries in /usr/lib/postgresql/*/bin to start clusters with"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no `postgres` user to run PostgreSQL clusters as (they refuse root)"
    if shutil.which("redis-server") is None:
        return "no redis-server to start"
    if haproxy_path() is None:
        return "haproxy is not installed (`make balancer` installs Debian's package)"
    return None


def _wait(
    what: str, ready: Any, proc: subprocess.Popen[bytes] | None, log: Path, timeout: float
) -> None:
    """Poll ``ready()`` until it is true; fail with the log's tail if the process exits."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{_tail(log)}")
        try:
            if ready():
                return
        except Exception as exc:  # not listening yet
            last = exc
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready within {timeout} s ({last}):\n{_tail(log)}")


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


class Postgres:
    """One PostgreSQL server on ``host``, its data in ``root/NAME``."""

    def __init__(self, host: Host, root: Path, port: int = 5432) -> None:
        self.host = host
        self.port = port
        self.data = root / host.name
        self.log = root / f"{host.name}-postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.bin = postgres_bin() or Path("/nonexistent")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.host.address}:{self.port}/{database}"

    def init_primary(self) -> None:
        """A new cluster: trust for the hosts' network, replication allowed."""
        self.data.mkdir(mode=0o700)
        shutil.chown(self.data, "postgres", "postgres")
        self.host.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
             "--no-sync", "-E", "UTF8"],
            user="postgres",
        )  # fmt: skip
        with open(self.data / "pg_hba.conf", "a") as hba:
            network = self.host.address.rsplit(".", 1)[0] + ".0/24"
            hba.write(f"host all all {network} trust\nhost replication all {network} trust\n")

    def init_standby(self, primary: Postgres) -> None:
        """A copy of ``primary`` (``pg_basebackup -R``) that streams from it once started."""
        self.data.mkdir(mode=0o700)
        shutil.chown(self.data, "postgres", "postgres")
        self.host.run(
            [str(self.bin / "pg_basebackup"), "-h", primary.host.address, "-p", str(primary.port),
             "-U", "postgres", "-D", str(self.data), "-X", "stream", "-R", "-c", "fast",
             "--no-sync"],
            user="postgres",
        )  # fmt: skip

    def start(self, timeout: float = 60) -> None:
        """Start the server on its host's address and wait until it answers."""
        argv = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        settings = {
            "listen_addresses": self.host.address,
            # TCP only: a socket lock file in the data directory would be
            # copied into a standby by pg_basebackup.
            "unix_socket_directories": "",
            "wal_level": "replica",
            "max_wal_senders": "4",
            "hot_standby": "on",
            "max_connections": "60",
            "shared_buffers": "32MB",
            "logging_collector": "off",
            # The standby is promoted by the test, not by a timeout.
            "wal_receiver_timeout": "5s",
        }
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        self.proc = self.host.popen(argv, self.log, user="postgres")
        _wait(f"PostgreSQL on {self.host}", lambda: self.query("SELECT 1"), self.proc, self.log,
              timeout)  # fmt: skip

    def query(
        self, sql: str, params: tuple[Any, ...] = (), database: str = "postgres"
    ) -> list[Any]:
        """Run ``sql`` (autocommit) from the server's own host; returns its rows."""
        import psycopg

        def run() -> list[Any]:
            with psycopg.connect(self.url(database), autocommit=True, connect_timeout=3) as conn:
                cur = conn.execute(sql, params)
                return cur.fetchall() if cur.description else []

        return self.host.call(run, timeout=30)

    def stop(self) -> None:
        """A fast shutdown (the teardown kills what is left anyway)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Redis:
    """``redis-server`` on ``host`` with nothing persisted; a replica of ``replica_of``."""

    def __init__(
        self, host: Host, root: Path, port: int = 6379, replica_of: Redis | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.replica_of = replica_of
        self.dir = root / f"{host.name}-redis"
        self.log = root / f"{host.name}-redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host.address}:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        self.dir.mkdir()
        argv = ["redis-server", "--bind", self.host.address, "--port", str(self.port),
                "--save", "", "--appendonly", "no", "--protected-mode", "no",
                "--dir", str(self.dir), "--daemonize", "no"]  # fmt: skip
        if self.replica_of is not None:
            argv += ["--replicaof", self.replica_of.host.address, str(self.replica_of.port)]
        self.proc = self.host.popen(argv, self.log)
        _wait(f"Redis on {self.host}", lambda: self.command("PING"), self.proc, self.log, timeout)

    def command(self, *args: str) -> Any:
        """One Redis command, sent from the server's own host."""
        import redis

        def run() -> Any:
            client = redis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=3)
            try:
                return client.execute_command(*args)  # type: ignore[no-untyped-call]
            finally:
                client.close()

        return self.host.call(run, timeout=30)


class Sentinel:
    """A Redis Sentinel (``redis-server CONFIG --sentinel``) on ``host`` watching ``master``.

    Quick to decide, for a test: the master is down after 1 s without an
    answer, and ``quorum`` Sentinels must agree.
    """

    NAME = "leasecast"

    def __init__(
        self, host: Host, root: Path, master: Redis, quorum: int = 2, port: int = 26379
    ) -> None:
        self.host = host
        self.port = port
        self.master = master
        self.quorum = quorum
        self.dir = root / f"{host.name}-sentinel"
        self.log = root / f"{host.name}-sentinel.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host.address}:{self.port}"

    def start(self, timeout: float = 30) -> None:
        self.dir.mkdir()
        config = self.dir / "sentinel.conf"  # the Sentinel rewrites it: a file of its own
        config.write_text(
            f"port {self.port}\nbind {self.host.address}\nprotected-mode no\n"
            f"daemonize no\ndir {self.dir}\n"
            f"sentinel monitor {self.NAME} {self.master.host.address} {self.master.port} "
            f"{self.quorum}\n"
            f"sentinel down-after-milliseconds {self.NAME} 1000\n"
            f"sentinel failover-timeout {self.NAME} 10000\n"
            f"sentinel parallel-syncs {self.NAME} 1\n"
        )
        self.proc = self.host.popen(["redis-server", str(config), "--sentinel"], self.log)
        _wait(f"Sentinel on {self.host}", lambda: self.command("PING"), self.proc, self.log,
              timeout)  # fmt: skip

    def command(self, *args: str) -> Any:
        """One command to this Sentinel, from its own host."""
        import redis

        def run() -> Any:
            client = redis.Redis(
                host=self.host.address, port=self.port, socket_connect_timeout=3, socket_timeout=3
            )
            try:
                return client.execute_command(*args)  # type: ignore[no-untyped-call]
            finally:
                client.close()

        return self.host.call(run, timeout=30)

    def master_state(self) -> dict[str, str]:
        """``SENTINEL MASTER leasecast`` as a dict of text."""
        reply = self.command("SENTINEL", "MASTER", self.NAME)
        if isinstance(reply, dict):
            items = list(reply.items())
        else:
            items = list(zip(reply[::2], reply[1::2], strict=True))
        return {_text(k): _text(v) for k, v in items}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Gateway:
    """One gateway process (daphne, ``gateway.serve``) on ``host``."""

    def __init__(self, host: Host, root: Path, env: dict[str, str]) -> None:
        self.host = host
        self.var = root / f"{host.name}-var"
        self.var.mkdir(exist_ok=True)
        self.env = {**base_env(self.var), **env}
        self.log = root / f"{host.name}-gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://{self.host.address}:{GATEWAY_PORT}"

    def manage(self, *args: str) -> str:
        """``manage.py ARGS`` on this gateway's host, with its settings."""
        return self.host.run([sys.executable, str(ROOT / "manage.py"), *args], env=self.env,
                             cwd=ROOT)  # fmt: skip

    def issue_token(self, *scopes: str, name: str) -> str:
        args = [arg for scope in scopes for arg in ("--scope", scope)]
        return self.manage("issue_token", name, *args).strip().splitlines()[-1]

    def start(self, timeout: float = 60) -> None:
        argv = [sys.executable, "-m", "gateway.serve", "-b", self.host.address,
                "-p", str(GATEWAY_PORT), "gateway.asgi:application"]  # fmt: skip
        self.proc = self.host.popen(argv, self.log, env=self.env, cwd=ROOT)

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.http}/healthz", timeout=2) as response:
                return bool(response.status == 200)

        _wait(f"gateway on {self.host}", lambda: self.host.call(healthy), self.proc, self.log,
              timeout)  # fmt: skip

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Balancer:
    """haproxy on ``host``: WebSockets and HTTP to the gateways, checked on ``/healthz``.

    The configuration of tests/integration/harness.py's balancer (docs/operations.md),
    on the balancer host's address; its stats page on the host's own loopback.
    """

    def __init__(self, host: Host, root: Path, gateways: list[Host]) -> None:
        self.host = host
        self.gateways = gateways
        self.config_path = root / "haproxy.cfg"
        self.log = root / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://{self.host.address}:{BALANCER_PORT}"

    @property
    def ws(self) -> str:
        return f"ws://{self.host.address}:{BALANCER_PORT}"

    def config(self) -> str:
        return haproxy_config(
            bind=f"{self.host.address}:{BALANCER_PORT}",
            servers=[(gw.name, f"{gw.address}:{GATEWAY_PORT}") for gw in self.gateways],
            check_host=self.host.address,
            check_ms=200,
            stats="127.0.0.1:8404",
        )

    def start(self) -> None:
        self.config_path.write_text(self.config())
        haproxy = haproxy_path() or "haproxy"
        self.host.run([haproxy, "-c", "-q", "-f", str(self.config_path)])
        self.proc = self.host.popen([haproxy, "-db", "-f", str(self.config_path)], self.log)

    def states(self) -> dict[str, str]:
        """Each gateway's status as haproxy sees it (``UP``, ``DOWN``...)."""

        def read() -> list[str]:
            with urllib.request.urlopen("http://127.0.0.1:8404/stats;csv", timeout=2) as response:
                text: str = response.read().decode()
                return text.splitlines()

        lines = self.host.call(read)
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {
            row["svname"]: row["status"]
            for row in rows
            if row.get("pxname") == "gateways" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_up(self, timeout: float = 30) -> None:
        """Until haproxy sees every gateway up."""
        _wait(
            "haproxy's gateways",
            lambda: set(self.states().values()) == {"UP"},
            self.proc,
            self.log,
            timeout,
        )


async def open_socket(
    client: Host, url: str, token: str, timeout: float = 5, **options: Any
) -> Socket:
    """A WebSocket to ``url`` opened from the client host (its TCP connection is the host's).

    ``options`` go to the WebSocket client (e.g. ``ping_interval`` and
    ``ping_timeout``, with which a peer that stopped answering is given up).
    """
    parts = urlsplit(url)
    address = (parts.hostname or "", parts.port or 80)
    sock = await asyncio.to_thread(
        client.call, lambda: socket.create_connection(address, timeout=timeout)
    )
    conn = await connect(
        url,
        sock=sock,
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=None,
        open_timeout=timeout,
        **options,
    )
    return Socket(conn)


async def request(
    client: Host, method: str, url: str, token: str | None = None, body: Any = None
) -> tuple[int, Any]:
    """One HTTP request from the client host; (status, decoded JSON)."""
    return await asyncio.to_thread(client.call, lambda: http(method, url, token, body))
