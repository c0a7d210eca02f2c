"""A Spark standalone cluster from pyspark's own scripts, and a proxy that holds requests.

:class:`StandaloneCluster` starts a master and workers as separate processes
with ``bin/spark-class`` (PyPI's pyspark has no ``sbin/start-master.sh``),
each in a process group of its own; a worker's executors (and their Python
workers) are its children, in its group. :class:`HoldingProxy` stands between
Spark and a real gateway: it forwards every request and answer as they are,
keeps a ledger of the commits the gateway confirmed, and can hold one
request before the gateway sees it, or one answer after the gateway acted on
it, until the test has killed what it wanted killed.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.gateways import free_port
from tests.support.waiting import wait_until_blocking

__all__ = [
    "Held",
    "HoldingProxy",
    "StandaloneCluster",
    "owner_of_connection",
    "process_chain",
    "spark_bin",
]


def spark_bin(name: str) -> Path:
    """One of pyspark's own scripts (``bin/spark-class``, ``bin/spark-submit``).

    Looked up when called: without pyspark the tests are skipped, not broken.
    """
    spec = importlib.util.find_spec("pyspark")
    assert spec is not None and spec.origin is not None, "pyspark is not installed"
    return Path(spec.origin).parent / "bin" / name


#: JVM start-up is most of a small cluster's start: the client compiler only,
#: the serial collector and small heaps start faster on a busy two-core machine.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_env(work: Path) -> dict[str, str]:
    """The environment of every Spark process of the cluster (and of the driver)."""
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",  # bind and advertise loopback only
        SPARK_LOCAL_HOSTNAME="127.0.0.1",
        SPARK_LOG_DIR=str(work / "logs"),
        SPARK_PID_DIR=str(work),
        SPARK_LOCAL_DIRS=str(work / "local"),  # scratch of the driver and the executors
        SPARK_DAEMON_JAVA_OPTS=FAST_JVM,
        # The master's REST submission server takes port 6066 by default: off.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
    )
    return env


class StandaloneCluster:
    """A master and ``workers`` workers (1 core, 1 GiB each) on loopback."""

    def __init__(self, work: Path, workers: int = 2) -> None:
        self.work = work
        self.env = spark_env(work)
        self.port = free_port()
        self.ui_port = free_port()
        self.count = workers
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
        self.procs[name] = subprocess.Popen(
            [str(spark_bin("spark-class")), *args],
            env=self.env,
            cwd=self.work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its group: the worker, its executors, their Python
        )

    def start(self) -> None:
        """Start the master and the workers at once (the workers retry until it listens)."""
        self._spawn(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port)),
            *("--webui-port", str(self.ui_port)),
        )
        for n in range(1, self.count + 1):
            (self.work / f"worker{n}").mkdir(parents=True, exist_ok=True)
            self._spawn(
                f"worker{n}",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                *("--host", "127.0.0.1", "--webui-port", "0"),
                *("--cores", "1", "--memory", "1g"),
                *("--work-dir", str(self.work / f"worker{n}")),
            )

    def state(self) -> dict[str, Any] | None:
        """The master's view (its web UI's JSON: workers, applications), or None before it answers.

        Raises:
            AssertionError: a process of the cluster exited.
        """
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited: {self.log(name)[-3000:]}")
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=5) as response:
                state: dict[str, Any] = json.load(response)
                return state
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_master(self, timeout: float = 180) -> None:
        """Until the master answers (a driver that finds none retries only 20 s later)."""
        wait_until_blocking(lambda: self.state() is not None, "the master", timeout=timeout)

    def wait_ready(self, timeout: float = 180) -> None:
        """Until every worker has registered with the master."""

        def ready() -> bool:
            state = self.state()
            return state is not None and int(state["aliveworkers"]) == self.count

        wait_until_blocking(
            ready, f"{self.count} workers registered with the master", timeout=timeout
        )

    def executors(self) -> list[int]:
        """The pids of the executor JVMs running now (children of this cluster's workers)."""
        workers = {proc.pid for name, proc in self.procs.items() if name.startswith("worker")}
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (proc / "cmdline").read_bytes()
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"CoarseGrainedExecutorBackend" in cmdline and parent in workers:
                found.append(int(proc.name))
        return found

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """``kill -9`` of every group this cluster started (a test's cluster keeps nothing)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def process_chain(pid: int) -> Iterator[tuple[int, str]]:
    """``pid`` and its ancestors, with their command lines."""
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        yield pid, cmdline
        pid = int(stat.rsplit(")", 1)[1].split()[1])


def owner_of_connection(local_port: int, remote_port: int) -> int | None:
    """The process holding the loopback TCP connection from ``local_port`` to ``remote_port``."""
    inode = None
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            remote = int(fields[2].rsplit(":", 1)[1], 16)
            if (local, remote) == (local_port, remote_port):
                inode = fields[9]
    if inode is None:
        return None
    wanted = f"socket:[{inode}]"
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == wanted for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
        except OSError:
            continue
    return None


@dataclass
class Held:
    """A request (or its answer) the proxy holds until :meth:`HoldingProxy.release`."""

    method: str
    path: str
    client_port: int
    #: the gateway's answer, when the answer is held (the gateway has acted)
    answer: dict[str, Any] | None = None
    released: threading.Event = field(default_factory=threading.Event)
    drop: bool = False


TXN_PATH = re.compile(r"^/api/transactions/(?P<txn>[^/]+)/(?P<rest>.+)$")


class HoldingProxy:
    """An HTTP/1.1 proxy (keep-alive) in front of a gateway.

    It listens at once; requests wait until :meth:`connect` names the gateway
    (so a driver can start while the gateway does).

    ``hold_stage(batch)`` holds the first ``PUT .../partitions/P`` of that
    micro-batch (transaction ``QUERY-BATCH``) before the gateway sees it;
    ``hold_commit_answer(batch)`` lets the gateway commit that batch, then
    holds its answer. :meth:`caught` waits for the held one; :meth:`release`
    forwards it, or drops the connection (``drop=True``) as a dead process's
    would be. ``commits`` is the ledger of every commit answer the gateway
    gave: ``(txn, committed, already)``.
    """

    def __init__(self) -> None:
        self.upstream = ""
        self.connected = threading.Event()
        self.lock = threading.Lock()
        self.rules: dict[tuple[str, int], bool] = {}  # (kind, batch) -> still armed
        self.held: list[Held] = []
        self.commits: list[tuple[str, int, bool]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            conn: http.client.HTTPConnection | None = None

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.forward()

            def do_PUT(self) -> None:
                self.forward()

            def do_POST(self) -> None:
                self.forward()

            def forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                match = TXN_PATH.match(self.path)
                txn, rest = (match["txn"], match["rest"]) if match else ("", "")
                batch = int(txn.rsplit("-", 1)[1]) if txn and txn[-1].isdigit() else -1
                port = self.client_address[1]
                if self.command == "PUT" and proxy._take("stage", batch):
                    held = proxy._hold(Held(self.command, self.path, port))
                    if held.drop:
                        self.close_connection = True
                        return
                if self.conn is None:
                    proxy.connected.wait()
                    self.conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                try:
                    self.conn.request(self.command, self.path, body, headers)
                    response = self.conn.getresponse()
                    data = response.read()
                except (OSError, http.client.HTTPException):
                    self.conn.close()
                    self.conn = None
                    self.close_connection = True  # the client sees the gateway gone too
                    return
                if response.status == 200 and rest == "commit":
                    answer = json.loads(data)
                    with proxy.lock:
                        proxy.commits.append((txn, int(answer["committed"]), answer["already"]))
                    if proxy._take("commit", batch):
                        held = proxy._hold(Held(self.command, self.path, port, answer))
                        if held.drop:
                            self.close_connection = True
                            return
                self.send_response(response.status)
                for name, value in response.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def finish(self) -> None:
                super().finish()
                if self.conn is not None:
                    self.conn.close()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def connect(self, upstream: str) -> None:
        """Forward to the gateway at ``upstream`` (``http://HOST:PORT``) from now on."""
        self.upstream = urlsplit(upstream).netloc
        self.connected.set()

    def hold_stage(self, batch: int) -> None:
        with self.lock:
            self.rules["stage", batch] = True

    def hold_commit_answer(self, batch: int) -> None:
        with self.lock:
            self.rules["commit", batch] = True

    def _take(self, kind: str, batch: int) -> bool:
        with self.lock:
            return self.rules.pop((kind, batch), False)

    def _hold(self, held: Held) -> Held:
        with self.lock:
            self.held.append(held)
        held.released.wait()
        return held

    def caught(self, count: int, timeout: float = 180) -> Held:
        """The ``count``-th held request (1-based), once it is held."""
        wait_until_blocking(
            lambda: len(self.held) >= count, f"held request {count}", timeout=timeout
        )
        return self.held[count - 1]

    def release(self, held: Held, drop: bool = False) -> None:
        held.drop = drop
        held.released.set()

    def close(self) -> None:
        for held in self.held:
            self.release(held, drop=True)
        self.server.shutdown()
        self.server.server_close()
