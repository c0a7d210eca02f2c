"""Task benchmark: django.tasks on Leasecast against Celery and django-tasks-db, in one run.

    python -m bench.tasks                        # SQLite, 10,000 tasks a system, ~8 minutes
    python -m bench.tasks --postgres             # PostgreSQL instead of SQLite
    python -m bench.tasks --database both        # SQLite and PostgreSQL in one run
    python -m bench.tasks --quick                # a smoke run, about 2 minutes
    python -m bench.tasks --profile DIR          # and py-spy profiles (bench.tasksite.profile)
    python -m bench.tasks --prefetch-multiplier 1,4  # Leasecast workers holding N and 4 x N

The same no-op task (it returns ``time.time()``, stored as its result) on
each system, with the same concurrency ``N`` (``--concurrency``, default 4),
laid out two ways (``--layout``, default both):

- **processes**: ``N`` worker processes that run one task at a time.
  Leasecast: ``N`` x ``manage.py leasecast_worker --concurrency 1``; Celery:
  ``celery worker --pool prefork -c N`` (a parent and ``N`` children).
- **threads**: one worker process running ``N`` tasks at once on threads.
  Leasecast: ``manage.py leasecast_worker --concurrency N``; Celery:
  ``celery worker --pool threads -c N``.
- django-tasks-db's ``db_worker`` runs one task at a time: ``N`` processes in
  either layout (``--interval 0.1``: it polls when idle, every second by
  default).

The systems:

- **leasecast**: ``gateway.tasks.LeasecastBackend``; a gateway (daphne, or
  ``--server uvicorn``) on a fresh database; a result is stored when the
  gateway commits the worker's ack with its outcome (``leasecast_task``,
  status SUCCESSFUL). Its workers hold up to ``M x N`` leases, ``M`` the
  worker's prefetch multiplier (its default, 4, unless
  ``--prefetch-multiplier`` names values: one job per value, each round).
- **celery**: Redis broker and Redis result backend, Celery's defaults
  otherwise (acks on receipt, prefetch multiplier 4).
- **django-tasks-db**: ``django_tasks_db.DatabaseBackend`` on a fresh
  database of the same engine.

One producer process (``bench.tasksite.producer``) per system enqueues from
one thread through the system's own API (``task.enqueue()`` in process, on
the database the gateway uses; Celery's ``apply_async``): a warm-up, then a
**burst** of ``--tasks`` enqueued as fast as the API allows while the
workers run (tasks/s = tasks / (last result seen stored - first enqueue)),
then a **paced** round of ``--paced`` tasks at ``--rate`` a second (the
latency of the path, not of a backlog). Latency is enqueue-to-start: the
start time the task returned (stored as its result) minus ``time.time()``
just before its ``enqueue()`` call. The CPU each group of processes used in
the burst (producer, gateway or broker, workers, PostgreSQL backends) is
read from ``/proc`` and reported per task.

Results are ratios within one run; the machine (2 cores) is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from tests.support.clients import http
from tests.support.databases import (
    ROOT,
    manage,
    postgres_database,
    postgres_unavailable,
    sqlite_database,
)
from tests.support.gateways import GatewayProcess

REDIS_URL = "redis://127.0.0.1:6379/0"
SETTINGS = "bench.tasksite.settings"
#: py-spy, for --profile, and its options (BENCH_PYSPY_FLAGS, e.g. "--gil", replaces
#: the default: sample without pausing the target)
PYSPY = Path(sys.executable).with_name("py-spy")
PYSPY_FLAGS = os.environ.get("BENCH_PYSPY_FLAGS", "--nonblocking").split()


@dataclass
class Result:
    """One system's figures."""

    system: str
    database: str
    #: "processes" or "threads" (how the concurrency is laid out, see --layout)
    layout: str
    #: the worker processes, in words
    workers: str
    tasks: int = 0
    tasks_per_s: float = 0.0
    enqueue_per_s: float = 0.0
    burst_p50_ms: float = 0.0
    burst_p99_ms: float = 0.0
    paced_rate: float = 0.0
    paced_p50_ms: float = 0.0
    paced_p99_ms: float = 0.0
    #: the paced round's enqueue() calls alone (a part of its latency)
    paced_enqueue_p50_ms: float = 0.0
    paced_enqueue_p99_ms: float = 0.0
    #: CPU milliseconds per task in the burst, by group of processes
    cpu_ms_per_task: dict[str, float] = field(default_factory=dict)
    #: Leasecast: the gateway's store transactions (group commits) and ops, per
    #: task, over the whole run (warm-up, burst and paced round)
    store_batches_per_task: float = 0.0
    store_ops_per_task: float = 0.0
    #: with several rounds: each round's tasks/s (the other figures are medians)
    rounds_tasks_per_s: list[float] = field(default_factory=list)
    #: tasks/s against Celery of the same layout and django-tasks-db of the same
    #: database: the median of the rounds' ratios (each round runs them back to back)
    vs_celery: float = 0.0
    vs_db: float = 0.0


class Processes:
    """Child processes with their output in log files, stopped with SIGTERM, then SIGKILL."""

    def __init__(self, var: Path) -> None:
        self.var = var
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log_path = self.var / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((proc, log_path))
        return proc

    def pids(self) -> str:
        """Their pids, comma-separated."""
        return ",".join(str(proc.pid) for proc, _ in self.procs)

    def check(self) -> None:
        """Raise if one of them exited (with the end of its log)."""
        for proc, log_path in self.procs:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.procs.clear()


class Profiler:
    """``py-spy record`` attached to processes (``--profile DIR``), raw stacks into ``DIR``.

    Sampling does not pause the targets (``--nonblocking``; ``BENCH_PYSPY_FLAGS``
    replaces that, e.g. ``--gil`` for the samples that hold the GIL). Summarise
    a file with ``python -m bench.tasksite.profile FILE``.
    """

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.procs: list[subprocess.Popen[bytes]] = []

    def attach(self, name: str, pid: int, *, subprocesses: bool = False) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        argv = [
            str(PYSPY),
            "record",
            *PYSPY_FLAGS,
            "--format=raw",
            f"--output={self.directory / f'{name}.txt'}",
            f"--pid={pid}",
            *(["--subprocesses"] if subprocesses else []),
        ]
        self.procs.append(
            subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )

    def stop(self) -> None:
        """Stop sampling; each py-spy writes its file as it exits."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def produce(
    system: str,
    queue: str,
    env: dict[str, str],
    args: argparse.Namespace,
    workers: Processes,
    watch: list[str],
    profiler: Profiler,
) -> dict[str, Any]:
    """Run the producer for ``system``; returns its report.

    ``watch``: the producer's ``--watch`` and ``--watch-cmdline`` options (the
    groups of processes whose CPU it reports).
    """
    argv = [
        sys.executable,
        "-m",
        "bench.tasksite.producer",
        f"--system={system}",
        f"--queue={queue}",
        f"--tasks={args.tasks}",
        f"--warmup={args.warmup}",
        f"--paced={args.paced}",
        f"--rate={args.rate}",
        *watch,
    ]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    profiler.attach(f"{system}-producer", proc.pid)
    while proc.poll() is None:
        try:
            workers.check()
        except RuntimeError:
            proc.kill()
            raise
        time.sleep(0.5)
    assert proc.stdout is not None
    out = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"the {system} producer failed ({proc.returncode})")
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def result_of(
    system: str, database: str, layout: str, workers: str, report: dict[str, Any], rate: float
) -> Result:
    burst, paced = report["burst"], report.get("paced")
    result = Result(
        system,
        database,
        layout,
        workers,
        tasks=burst["tasks"],
        tasks_per_s=burst["tasks_per_s"],
        enqueue_per_s=burst["enqueue_per_s"],
        burst_p50_ms=burst["p50_ms"],
        burst_p99_ms=burst["p99_ms"],
        cpu_ms_per_task=burst["cpu_ms_per_task"],
    )
    if paced:
        result.paced_rate = rate
        result.paced_p50_ms, result.paced_p99_ms = paced["p50_ms"], paced["p99_ms"]
        result.paced_enqueue_p50_ms = paced["enqueue_p50_ms"]
        result.paced_enqueue_p99_ms = paced["enqueue_p99_ms"]
    return result


def postgres_watch(env: dict[str, str]) -> list[str]:
    """The producer's option that watches the PostgreSQL backends of this database, if any."""
    url = env.get("DATABASE_URL")
    return [f"--watch-cmdline=postgres={url.rsplit('/', 1)[1]}"] if url else []


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary directory (databases, logs), removed unless the job fails."""
    var = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield var
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}\n(logs in {var})") from exc
    shutil.rmtree(var, ignore_errors=True)


@contextmanager
def database(var: Path, engine: str) -> Iterator[dict[str, str]]:
    """A fresh migrated database of ``engine``; yields the environment selecting it."""
    db: AbstractContextManager[dict[str, str]]
    db = postgres_database(var) if engine == "postgres" else sqlite_database(var)
    with db as env:
        yield env


def leasecast(
    engine: str, layout: str, args: argparse.Namespace, multiplier: int | None = None
) -> Result:
    queue = f"bench-{int(time.time() * 1000)}"
    with (
        scratch(f"leasecast-bench-tasks-{engine}-") as var,
        database(var, engine) as env,
        ExitStack() as stack,  # its processes stop before the database goes
    ):
        gateway = GatewayProcess(env, var, name=f"gateway-{engine}", server=args.server)
        gateway.start()
        stack.callback(gateway.stop)
        token = gateway.issue_token(f"consume:{queue}", name="bench-tasks")
        admin = gateway.issue_token("admin", name="bench-stats")
        site = {**env, "DJANGO_SETTINGS_MODULE": SETTINGS}
        workers = Processes(var)
        stack.callback(workers.stop)
        worker_env = {**site, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": token}
        if multiplier is not None:
            worker_env["LEASECAST_WORKER_PREFETCH_MULTIPLIER"] = str(multiplier)
        # processes: N workers that run one task at a time; threads: one with N threads.
        per_worker = args.concurrency if layout == "threads" else 1
        count = args.concurrency // per_worker
        for i in range(count):
            workers.start(
                f"worker-{i}",
                [
                    sys.executable,
                    str(ROOT / "manage.py"),
                    "leasecast_worker",
                    f"--queue={queue}",
                    f"--concurrency={per_worker}",
                    "-v0",
                ],
                worker_env,
            )
        assert gateway.proc is not None
        profiler = Profiler(args.profile and args.profile / f"leasecast-{engine}")
        stack.callback(profiler.stop)
        profiler.attach("gateway", gateway.proc.pid)
        profiler.attach("worker-0", workers.procs[0][0].pid)
        watch = [f"--watch=gateway={gateway.proc.pid}", f"--watch=workers={workers.pids()}"]
        watch += postgres_watch(env)
        before = store_figures(gateway, admin)
        report = produce("leasecast", queue, site, args, workers, watch, profiler)
        after = store_figures(gateway, admin)
    shape = f"{count} x leasecast_worker --concurrency {per_worker}"
    if multiplier is not None:
        shape += f", prefetch multiplier {multiplier}"
    result = result_of("leasecast", engine, layout, shape, report, args.rate)
    tasks = sum(phase["tasks"] for phase in report.values())
    result.store_batches_per_task = (after[0] - before[0]) / tasks
    result.store_ops_per_task = (after[1] - before[1]) / tasks
    return result


def store_figures(gateway: GatewayProcess, token: str) -> tuple[int, int]:
    """The gateway's store transactions and ops so far (``/api/stats``)."""
    status, data = http("GET", f"{gateway.http}/api/stats", token)
    if status != 200:
        raise RuntimeError(f"/api/stats answered {status}: {data}")
    process = data["process"]
    return int(process["store_batches"]), int(process["store_ops"])


def django_tasks_db(engine: str, args: argparse.Namespace) -> Result:
    queue = f"bench-{int(time.time() * 1000)}"
    with (
        scratch(f"leasecast-bench-tasks-db-{engine}-") as var,
        database(var, engine) as env,
        ExitStack() as stack,  # its processes stop before the database goes
    ):
        site = {**env, "DJANGO_SETTINGS_MODULE": SETTINGS, "BENCH_TASK_BACKEND": "db"}
        manage(site, "migrate", "--noinput", "-v0")  # django_tasks_db's table
        workers = Processes(var)
        stack.callback(workers.stop)
        for i in range(args.concurrency):
            workers.start(
                f"db-worker-{i}",
                [
                    sys.executable,
                    str(ROOT / "manage.py"),
                    "db_worker",
                    f"--queue-name={queue}",
                    "--interval=0.1",
                    "--no-startup-delay",
                    "--no-reload",
                    "-v0",
                ],
                site,
            )
        profiler = Profiler(args.profile and args.profile / f"django-tasks-db-{engine}")
        stack.callback(profiler.stop)
        profiler.attach("worker-0", workers.procs[0][0].pid)
        watch = [f"--watch=workers={workers.pids()}", *postgres_watch(env)]
        report = produce("db", queue, site, args, workers, watch, profiler)
    shape = f"{args.concurrency} x db_worker"
    return result_of("django-tasks-db", engine, "processes", shape, report, args.rate)


def celery(layout: str, args: argparse.Namespace) -> Result:
    import redis

    queue = f"bench-tasks-{int(time.time() * 1000)}"
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE",)}
    env.update(BENCH_CELERY_REDIS=args.redis, PYTHONPATH=str(ROOT))
    pool = "threads" if layout == "threads" else "prefork"
    profiler = Profiler(args.profile and args.profile / f"celery-{pool}")
    with scratch("leasecast-bench-tasks-celery-") as var:
        workers = Processes(var)
        try:
            report = _celery_run(queue, pool, env, args, workers, profiler)
        finally:
            profiler.stop()
            workers.stop()
            redis.Redis.from_url(args.redis).delete(queue, f"_kombu.binding.{queue}")
    shape = f"celery worker --pool {pool} -c {args.concurrency}"
    return result_of("celery", "redis", layout, shape, report, args.rate)


def _celery_run(
    queue: str,
    pool: str,
    env: dict[str, str],
    args: argparse.Namespace,
    workers: Processes,
    profiler: Profiler,
) -> dict[str, Any]:
    """Start Celery's worker and run the producer; returns its report."""
    import redis

    celery_worker = workers.start(
        "celery",
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench.tasksite.celery_app",
            "worker",
            f"--queues={queue}",
            f"--pool={pool}",
            f"--concurrency={args.concurrency}",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            f"--hostname=bench-{queue}@%h",
        ],
        env,
    )
    client = redis.Redis.from_url(args.redis)
    broker = client.info("server")["process_id"]
    watch = [f"--watch=redis={broker}", f"--watch=workers={workers.pids()}"]
    profiler.attach("workers", celery_worker.pid, subprocesses=True)
    return produce("celery", queue, env, args, workers, watch, profiler)


def table(results: list[Result]) -> str:
    """Markdown table: medians over the rounds, ratios against Celery (same layout) and
    django-tasks-db (same database)."""
    lines = [
        "| system | database | workers | tasks/s | tasks/s rounds | enqueue/s "
        "| burst p50 ms | burst p99 ms | paced p50 ms | paced p99 ms "
        "| paced enqueue() p50 / p99 ms | tasks/s vs Celery | tasks/s vs django-tasks-db |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        vs_celery = f"{r.vs_celery:.2f}x" if r.vs_celery else "-"
        vs_db = f"{r.vs_db:.2f}x" if r.vs_db else "-"
        rounds = ", ".join(f"{v:,.0f}" for v in r.rounds_tasks_per_s)
        lines.append(
            f"| {r.system} | {r.database} | {r.workers} | {r.tasks_per_s:,.0f} | {rounds} "
            f"| {r.enqueue_per_s:,.0f} | {r.burst_p50_ms:,.0f} | {r.burst_p99_ms:,.0f} "
            f"| {r.paced_p50_ms:.1f} | {r.paced_p99_ms:.1f} "
            f"| {r.paced_enqueue_p50_ms:.2f} / {r.paced_enqueue_p99_ms:.2f} "
            f"| {vs_celery} | {vs_db} |"
        )
    return "\n".join(lines)


def aggregate(rounds: list[dict[str, Result]]) -> list[Result]:
    """One result a job: the median of each figure over the rounds, and the ratios."""
    names = list(dict.fromkeys(name for round_ in rounds for name in round_))
    merged: list[Result] = []
    for name in names:
        runs = [round_[name] for round_ in rounds if name in round_]
        first = runs[0]
        result = Result(first.system, first.database, first.layout, first.workers, first.tasks)
        for attr in (
            "tasks_per_s",
            "enqueue_per_s",
            "burst_p50_ms",
            "burst_p99_ms",
            "paced_rate",
            "paced_p50_ms",
            "paced_p99_ms",
            "paced_enqueue_p50_ms",
            "paced_enqueue_p99_ms",
            "store_batches_per_task",
            "store_ops_per_task",
        ):
            setattr(result, attr, statistics.median(getattr(r, attr) for r in runs))
        keys = dict.fromkeys(k for r in runs for k in r.cpu_ms_per_task)
        result.cpu_ms_per_task = {
            k: statistics.median(r.cpu_ms_per_task[k] for r in runs if k in r.cpu_ms_per_task)
            for k in keys
        }
        result.rounds_tasks_per_s = [r.tasks_per_s for r in runs]
        for attr, base in (
            ("vs_celery", f"celery-{first.layout}"),
            ("vs_db", f"django-tasks-db-{first.database}"),
        ):
            ratios = [
                round_[name].tasks_per_s / round_[base].tasks_per_s
                for round_ in rounds
                if name in round_ and base in round_
            ]
            if ratios:
                setattr(result, attr, statistics.median(ratios))
        merged.append(result)
    return merged


def cpu_table(results: list[Result]) -> str:
    """CPU milliseconds per task in the burst, by group of processes."""
    names = list(dict.fromkeys(k for r in results for k in r.cpu_ms_per_task))
    lines = [
        f"| system | database | workers | {' | '.join(names)} | total |",
        "|---|---|---|" + "---:|" * (len(names) + 1),
    ]
    for r in results:
        cells = [r.cpu_ms_per_task.get(n) for n in names]
        text = ["-" if c is None else f"{c:.2f}" for c in cells]
        total = sum(c for c in cells if c is not None)
        lines.append(
            f"| {r.system} | {r.database} | {r.workers} | {' | '.join(text)} | {total:.2f} |"
        )
    store = [r for r in results if r.store_batches_per_task]
    if store:
        lines += ["", "Leasecast gateway, per task over the run:", ""]
        lines += ["| database | workers | store transactions | store ops |", "|---|---|---:|---:|"]
        lines += [
            f"| {r.database} | {r.workers} | {r.store_batches_per_task:.2f} "
            f"| {r.store_ops_per_task:.2f} |"
            for r in store
        ]
    return "\n".join(lines)


def jobs_of(args: argparse.Namespace, engines: list[str]) -> list[tuple[str, Any]]:
    """``(name, run)`` for every system, database and layout asked for, in order."""
    layouts = ["processes", "threads"] if args.layout == "both" else [args.layout]
    jobs: list[tuple[str, Any]] = []
    for system in args.systems:
        if system == "db":  # db_worker runs one task at a time: N processes in any layout
            for engine in engines:
                jobs.append((f"django-tasks-db-{engine}", partial(django_tasks_db, engine, args)))
            continue
        for layout in layouts:
            if system == "celery":
                jobs.append((f"celery-{layout}", partial(celery, layout, args)))
                continue
            for engine in engines:
                for multiplier in args.prefetch_multiplier or [None]:
                    name = f"leasecast-{engine}-{layout}"
                    if multiplier is not None:
                        name += f"-m{multiplier}"
                    jobs.append((name, partial(leasecast, engine, layout, args, multiplier)))
    return jobs


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every job, ``--rounds`` times in rotation (so each round meets similar load)."""
    rounds: list[dict[str, Result]] = []
    skipped: dict[str, str] = {}
    engines = ["sqlite", "postgres"] if args.database == "both" else [args.database]
    if "postgres" in engines:
        reason = postgres_unavailable()
        if reason:
            skipped["postgres"] = reason
            engines.remove("postgres")
    jobs = jobs_of(args, engines)
    for number in range(1, args.rounds + 1):
        rounds.append({})
        for name, job in jobs:
            print(f"== {name} (round {number} of {args.rounds})", file=sys.stderr, flush=True)
            try:
                rounds[-1][name] = job()
            except RuntimeError as exc:
                skipped[f"{name} (round {number})"] = str(exc)
                print(f"   failed: {exc}", file=sys.stderr, flush=True)
    return {
        "results": [asdict(r) for r in aggregate(rounds)],
        "rounds": [{name: asdict(r) for name, r in round_.items()} for round_ in rounds],
        "skipped": skipped,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.tasks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=5_000, help="tasks in the burst")
    parser.add_argument(
        "--rounds", type=int, default=3, help="every system this many times, in rotation"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="N: tasks at once")
    parser.add_argument(
        "--prefetch-multiplier",
        metavar="M[,M...]",
        help="Leasecast workers hold up to M x N leases (LEASECAST_WORKER_PREFETCH_MULTIPLIER; "
        "default: the worker's default); several values: one Leasecast job each, in the "
        "same rounds",
    )
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--paced", type=int, default=300, help="tasks in the paced round")
    parser.add_argument("--rate", type=float, default=50.0, help="paced tasks a second")
    parser.add_argument(
        "--layout",
        choices=("processes", "threads", "both"),
        default="both",
        help="N worker processes (Celery prefork) or one worker with N threads (Celery "
        "threads pool; db_worker has no threads: N processes either way); default both",
    )
    parser.add_argument(
        "--server", choices=("daphne", "uvicorn"), default="daphne", help="the gateway's"
    )
    parser.add_argument("--database", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--postgres", action="store_true", help="same as --database postgres")
    parser.add_argument(
        "--systems", default="leasecast,celery,db", help="any of leasecast, celery, db"
    )
    parser.add_argument("--redis", default=REDIS_URL, help="Celery's broker and result backend")
    parser.add_argument("--quick", action="store_true", help="1,000 tasks, 100 paced, one round")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="py-spy the gateway, a worker and the producer of each system into DIR",
    )
    args = parser.parse_args(argv)
    if args.profile and not PYSPY.exists():
        parser.error(f"--profile needs py-spy ({PYSPY} is missing: pip install py-spy)")
    if args.postgres:
        args.database = "postgres"
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    try:
        args.prefetch_multiplier = [
            int(m) for m in (args.prefetch_multiplier or "").split(",") if m.strip()
        ]
    except ValueError:
        parser.error(f"--prefetch-multiplier: not integers: {args.prefetch_multiplier!r}")
    if args.quick:
        args.tasks, args.warmup, args.paced, args.rounds = 1_000, 100, 100, 1
    started = time.time()
    data = run(args)
    results = [Result(**r) for r in data["results"]]
    print(
        f"\nTasks, {args.tasks:,} in the burst, concurrency {args.concurrency}, "
        f"paced {args.paced:,} at {args.rate:g}/s, gateway on {args.server}, "
        f"medians of {args.rounds} round(s):\n"
    )
    print(table(results))
    print("\nCPU ms per task in the burst, by process group:\n")
    print(cpu_table(results))
    for name, reason in data["skipped"].items():
        print(f"\nskipped {name}: {reason}")
    print(f"\n({time.time() - started:.0f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": vars(args) | {"json": str(args.json)}, **data}, indent=2)
        )


if __name__ == "__main__":
    main()
