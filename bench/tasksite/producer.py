"""Enqueue no-op tasks and read their results: the producing side of ``bench/tasks.py``.

    python -m bench.tasksite.producer --system leasecast|db|celery --queue Q \
        --tasks N [--warmup W] [--paced C --rate R]

Runs in a process of its own, started by ``bench/tasks.py`` with the
system's environment (``leasecast`` and ``db`` need
``DJANGO_SETTINGS_MODULE=bench.tasksite.settings`` and the gateway's database;
``celery`` needs nothing but Redis). One thread enqueues through each
system's own API: ``task.enqueue()`` (``django.tasks``, in this process, on
the database the gateway uses) or Celery's ``apply_async``.

Phases, each waiting until every one of its tasks has a stored SUCCESSFUL
result before the next starts:

1. **warm-up**: ``W`` tasks (the workers connect and import everything);
2. **burst**: ``N`` tasks enqueued as fast as the API allows while the
   workers run; the clock runs from the first enqueue until the last result
   is seen stored (polled every 50 ms);
3. **paced**: ``C`` tasks at ``R`` a second, for the latency of the path
   rather than of a backlog.

A task's latency is its start (the no-op task returns ``time.time()`` when it
starts, stored as its result) minus ``time.time()`` just before its
``enqueue()`` call in this process. Prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from bench.tasksite.cpu import Meter, matching, trees

POLL = 0.05  # seconds between looks at the stored results
STALL = 120.0  # seconds without progress before a phase gives up


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class System(Protocol):
    """How the producer drives one task system."""

    def enqueue(self) -> str:
        """Enqueue the no-op task; returns its result id."""
        ...

    def finished(self, ids: list[str]) -> dict[str, bool]:
        """Of ``ids``, those with a stored final result: True if SUCCESSFUL, False if FAILED."""
        ...

    def started(self, ids: list[str]) -> dict[str, float]:
        """The start time each task stored as its result, by result id."""
        ...


class Leasecast:
    """``gateway.tasks.LeasecastBackend``: the result rows are ``leasecast_task``."""

    def __init__(self, queue: str) -> None:
        from bench.tasksite.jobs import noop
        from gateway.models import TaskRecord

        self.task = noop.using(queue_name=queue)
        self.records = TaskRecord.objects.all()

    def enqueue(self) -> str:
        return str(self.task.enqueue().id)

    def finished(self, ids: list[str]) -> dict[str, bool]:
        rows = self.records.filter(id__in=ids, status__in=("SUCCESSFUL", "FAILED"))
        return {i: status == "SUCCESSFUL" for i, status in rows.values_list("id", "status")}

    def started(self, ids: list[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for chunk in _chunks(ids):
            rows = self.records.filter(id__in=chunk, status="SUCCESSFUL")
            found.update((i, _seconds(v)) for i, v in rows.values_list("id", "return_value"))
        return found


class DatabaseTasks:
    """``django_tasks_db.DatabaseBackend``: the result rows are ``DBTaskResult``."""

    def __init__(self, queue: str) -> None:
        from django_tasks_db.models import DBTaskResult

        from bench.tasksite.jobs import noop

        self.task = noop.using(queue_name=queue)
        self.records = DBTaskResult.objects.all()

    def enqueue(self) -> str:
        return str(uuid.UUID(str(self.task.enqueue().id)))

    def finished(self, ids: list[str]) -> dict[str, bool]:
        rows = self.records.filter(id__in=ids, status__in=("SUCCESSFUL", "FAILED"))
        return {
            str(uuid.UUID(str(i))): status == "SUCCESSFUL"
            for i, status in rows.values_list("id", "status")
        }

    def started(self, ids: list[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for chunk in _chunks(ids):
            rows = self.records.filter(id__in=chunk, status="SUCCESSFUL")
            found.update(
                (str(uuid.UUID(str(i))), float(v))
                for i, v in rows.values_list("id", "return_value")
            )
        return found


class CeleryTasks:
    """Celery, Redis broker and Redis result backend (``celery-task-meta-ID`` keys)."""

    def __init__(self, queue: str) -> None:
        from bench.tasksite.celery_app import app, noop

        self.queue = queue
        self.task = noop
        self.redis = app.backend.client

    def enqueue(self) -> str:
        return str(self.task.apply_async(queue=self.queue).id)

    def _metas(self, ids: list[str]) -> dict[str, Any]:
        values = self.redis.mget([f"celery-task-meta-{i}" for i in ids])
        return {i: json.loads(raw) for i, raw in zip(ids, values, strict=True) if raw is not None}

    def finished(self, ids: list[str]) -> dict[str, bool]:
        return {
            i: meta["status"] == "SUCCESS"
            for i, meta in self._metas(ids).items()
            if meta["status"] in ("SUCCESS", "FAILURE", "REVOKED")
        }

    def started(self, ids: list[str]) -> dict[str, float]:
        found: dict[str, float] = {}
        for chunk in _chunks(ids):
            found.update((i, float(meta["result"])) for i, meta in self._metas(chunk).items())
        return found


def _seconds(value: Any) -> float:
    """A stored return value, the no-op task's start time."""
    return float(value)


def _chunks(ids: list[str], size: int = 500) -> list[list[str]]:
    return [ids[first : first + size] for first in range(0, len(ids), size)]


class Tracker:
    """Which enqueued tasks have a stored result, read oldest first, 500 at a time.

    A look stops at the first chunk with a task not finished yet, so each id is
    read about once when done rather than once per poll, whatever the backlog.
    """

    def __init__(self, system: System) -> None:
        self.system = system
        self.pending: deque[str] = deque()
        self.successful = 0
        self.failed = 0

    def add(self, result_id: str) -> None:
        self.pending.append(result_id)

    def look(self) -> None:
        while self.pending:
            chunk = [self.pending.popleft() for _ in range(min(500, len(self.pending)))]
            done = self.system.finished(chunk)
            self.successful += sum(done.values())
            self.failed += len(done) - sum(done.values())
            waiting = [i for i in chunk if i not in done]
            if waiting:
                self.pending.extendleft(reversed(waiting))
                return


def wait_done(tracker: Tracker, what: str) -> float:
    """Poll until every tracked task has a SUCCESSFUL result; returns the perf_counter then.

    Raises:
        RuntimeError: a task failed, or nothing progressed for ``STALL`` seconds.
    """
    seen, since = -1, time.perf_counter()
    while True:
        tracker.look()
        now = time.perf_counter()
        if tracker.failed:
            raise RuntimeError(f"{what}: {tracker.failed} task(s) FAILED")
        if not tracker.pending:
            return now
        if tracker.successful != seen:
            seen, since = tracker.successful, now
        elif now - since > STALL:
            left = len(tracker.pending)
            raise RuntimeError(f"{what}: {left} without a result for {STALL:.0f}s")
        time.sleep(POLL)


def phase(system: System, meter: Meter, count: int, rate: float = 0.0) -> dict[str, Any]:
    """Enqueue ``count`` tasks (at ``rate`` a second, or flat out), wait for their results."""
    tracker = Tracker(system)
    sent: dict[str, float] = {}
    calls: list[float] = []  # how long each enqueue() call took
    cpu_before, own_before = meter.read(), time.process_time()
    start = time.perf_counter()
    for i in range(count):
        if rate:
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        t = time.time()
        result_id = system.enqueue()
        calls.append(time.time() - t)
        sent[result_id] = t
        tracker.add(result_id)
    enqueued = time.perf_counter()
    end = wait_done(tracker, f"{count} tasks")
    cpu = {"producer": time.process_time() - own_before}
    cpu.update((k, v - cpu_before[k]) for k, v in meter.read().items())
    started = system.started(list(sent))
    latencies = [started[i] - t for i, t in sent.items() if i in started]
    if len(latencies) != count:
        raise RuntimeError(f"{count - len(latencies)} task(s) have no stored start time")
    return {
        "tasks": count,
        "seconds": end - start,
        "enqueue_seconds": enqueued - start,
        "tasks_per_s": count / (end - start),
        "enqueue_per_s": count / (enqueued - start),
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": max(latencies) * 1000,
        # the enqueue() call alone, a part of the latency above
        "enqueue_p50_ms": percentile(calls, 0.5) * 1000,
        "enqueue_p99_ms": percentile(calls, 0.99) * 1000,
        # CPU milliseconds per task, by group of processes (producer: this one)
        "cpu_ms_per_task": {k: v * 1000 / count for k, v in cpu.items()},
    }


def groups(watch: list[str], watch_cmdline: list[str]) -> dict[str, Callable[[], list[int]]]:
    """``NAME=PID,PID`` (those and their descendants) and ``NAME=TEXT`` (by command line)."""
    found: dict[str, Callable[[], list[int]]] = {}
    for spec in watch:
        name, _, pids = spec.partition("=")
        found[name] = trees(int(p) for p in pids.split(",") if p)
    for spec in watch_cmdline:
        name, _, text = spec.partition("=")
        found[name] = matching(text)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tasksite.producer")
    parser.add_argument("--system", choices=("leasecast", "db", "celery"), required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--paced", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--watch", action="append", default=[], metavar="NAME=PID,PID")
    parser.add_argument("--watch-cmdline", action="append", default=[], metavar="NAME=TEXT")
    args = parser.parse_args(argv)
    system: System
    if args.system == "celery":
        system = CeleryTasks(args.queue)
    else:
        import django

        django.setup()
        system = Leasecast(args.queue) if args.system == "leasecast" else DatabaseTasks(args.queue)
    meter = Meter(groups(args.watch, args.watch_cmdline))
    report: dict[str, Any] = {}
    for name, count, rate in (
        ("warmup", args.warmup, 0.0),
        ("burst", args.tasks, 0.0),
        ("paced", args.paced, args.rate),
    ):
        if count:
            report[name] = phase(system, meter, count, rate)
            print(f"   {name}: {report[name]}", file=sys.stderr, flush=True)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
