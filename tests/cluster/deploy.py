"""A whole deployment on separate hosts, started and removed by the tests.

Hosts (network namespaces on one bridge, tests/cluster/netns.py)::

    client  10.231.0.2    the test's workers, producers and subscribers
    lb      10.231.0.3    haproxy :8000 -> gw1, gw2
    gw1     10.231.0.11   gateway :8000
    gw2     10.231.0.12   gateway :8000
    db1     10.231.0.21   PostgreSQL :5432 (the primary)
    db2     10.231.0.22   PostgreSQL :5432 (a synchronous streaming standby, when asked for)
    redis   10.231.0.31   Redis :6379 (the master; and a Sentinel :26379, when asked for)
    redis2  10.231.0.32   a replica of it and a Sentinel (when asked for)
    redis3  10.231.0.33   a third Sentinel (when asked for)

:func:`deployment` starts it all and, whatever happens, kills every process
of every host and deletes the namespaces and data directories afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.netns import Host, Network
from tests.cluster.services import Balancer, Gateway, Postgres, Redis, Sentinel

__all__ = ["Deployment", "deployment"]

#: The queue's database on the PostgreSQL hosts.
DATABASE = "leasecast"


@dataclass
class Deployment:
    """What a test talks to."""

    client: Host
    balancer: Balancer
    gateways: list[Gateway]
    primary: Postgres
    standby: Postgres | None
    redis: Redis
    token: str
    #: with Sentinel: the master's replica and the Sentinels (one on each Redis host)
    replica: Redis | None
    sentinels: list[Sentinel]
    root: Path
    database_url: str

    def logs(self) -> str:
        """The tail of every server's log, for a failure message."""
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)


def _start_all(gateways: list[Gateway]) -> None:
    """Start the gateways side by side (each waits for its own ``/healthz``)."""
    errors: list[BaseException] = []

    def start(gw: Gateway) -> None:
        try:
            gw.start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(gw,)) for gw in gateways]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    if errors:
        raise errors[0]


def _make_synchronous(primary: Postgres, standby: Postgres, timeout: float = 30) -> None:
    """Wait until the standby streams, then make every commit wait for it."""
    deadline = time.monotonic() + timeout
    while not primary.query("SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"):
        if time.monotonic() > deadline:
            raise RuntimeError("the standby never streamed from the primary")
        time.sleep(0.1)
    primary.query("ALTER SYSTEM SET synchronous_standby_names = '*'")
    primary.query("SELECT pg_reload_conf()")
    while not primary.query("SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"):
        if time.monotonic() > deadline:
            raise RuntimeError("the standby never became synchronous")
        time.sleep(0.1)


def _watching(replica: Redis, sentinels: list[Sentinel], timeout: float = 30) -> None:
    """Wait until the replica is in sync and every Sentinel knows the others and it."""
    deadline = time.monotonic() + timeout
    while True:
        info = replica.command("INFO", "replication")
        linked = isinstance(info, dict) and info.get("master_link_status") == "up"
        states = [s.master_state() for s in sentinels]
        if linked and all(
            st.get("num-other-sentinels") == str(len(sentinels) - 1) and st.get("num-slaves") == "1"
            for st in states
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"Sentinels not ready: replica {info}, sentinels {states}")
        time.sleep(0.2)


#: Data directories and logs of a run: ``leasecast-cluster-<pid of the test run>-...``.
_ROOT_PREFIX = "leasecast-cluster-"


def _sweep_stale_roots() -> None:
    """Remove the directories of runs that were killed before their teardown."""
    for path in Path(tempfile.gettempdir()).glob(f"{_ROOT_PREFIX}*-*"):
        pid = path.name[len(_ROOT_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def deployment(*, standby: bool = False, sentinel: bool = False) -> Iterator[Deployment]:
    """Start the hosts and servers; ``standby`` adds db2, a synchronous standby of db1;
    ``sentinel`` a replica of Redis and three Sentinels, the gateways on
    ``REDIS_URL=redis+sentinel://...``.

    With a standby, the gateways' ``DATABASE_URL`` names both servers (libpq's
    multi-host form with ``target_session_attrs=read-write``), as
    docs/operations.md says to run them.
    """
    _sweep_stale_roots()
    root = Path(tempfile.mkdtemp(prefix=f"{_ROOT_PREFIX}{os.getpid()}-"))
    root.chmod(0o755)  # the postgres user reaches its data directories through it
    network = Network()
    try:
        hosts = {
            name: network.add(name, octet)
            for name, octet in [
                ("client", 2),
                ("lb", 3),
                ("gw1", 11),
                ("gw2", 12),
                ("db1", 21),
                ("db2", 22),
                ("redis", 31),
                *([("redis2", 32), ("redis3", 33)] if sentinel else []),
            ]
        }
        redis = Redis(hosts["redis"], root)
        redis.start()
        redis_url = redis.url
        replica: Redis | None = None
        sentinels: list[Sentinel] = []
        if sentinel:
            replica = Redis(hosts["redis2"], root, replica_of=redis)
            replica.start()
            sentinels = [
                Sentinel(hosts[name], root, redis) for name in ("redis", "redis2", "redis3")
            ]
            for s in sentinels:
                s.start()
            _watching(replica, sentinels)
            addresses = ",".join(s.address for s in sentinels)
            redis_url = f"redis+sentinel://{addresses}/{Sentinel.NAME}/0"
        primary = Postgres(hosts["db1"], root)
        primary.init_primary()
        primary.start()
        primary.query(f'CREATE DATABASE "{DATABASE}"')
        second = Postgres(hosts["db2"], root) if standby else None
        servers = [primary, *([second] if second else [])]
        # connect_timeout: a host that does not answer at all (not only a
        # refused port) costs a new connection two seconds, not minutes.
        database_url = (
            "postgresql://postgres@"
            + ",".join(f"{db.host.address}:{db.port}" for db in servers)
            + f"/{DATABASE}?connect_timeout=2"
            + ("&target_session_attrs=read-write" if second else "")
        )
        env = {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "GATEWAY_ALLOWED_HOSTS": ",".join(hosts[name].address for name in ("lb", "gw1", "gw2")),
            "GATEWAY_SHUTDOWN_GRACE": "2",
        }
        gateways = [Gateway(hosts[name], root, env) for name in ("gw1", "gw2")]
        # The schema and a token first: the standby is a copy of the primary as it is then.
        gateways[0].manage("migrate", "--noinput", "-v0")
        token = gateways[0].issue_token("admin", name="cluster")
        if second is not None:
            second.init_standby(primary)
            second.start()
            _make_synchronous(primary, second)
        _start_all(gateways)
        balancer = Balancer(hosts["lb"], root, [gw.host for gw in gateways])
        balancer.start()
        balancer.wait_up()
        yield Deployment(
            client=hosts["client"],
            balancer=balancer,
            gateways=gateways,
            primary=primary,
            standby=second,
            redis=redis,
            token=token,
            replica=replica,
            sentinels=sentinels,
            root=root,
            database_url=database_url,
        )
    finally:
        network.close()  # every process of every host, then the namespaces
        keep = os.environ.get("LEASECAST_CLUSTER_LOGS")
        if keep:  # a directory to copy the servers' logs to, for a look afterwards
            shutil.copytree(root, Path(keep) / root.name, ignore=_not_logs, dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)


def _not_logs(directory: str, names: list[str]) -> list[str]:
    """Everything but the ``*.log`` files at the top of a run's directory."""
    return [n for n in names if not n.endswith(".log") or Path(directory, n).is_dir()]
