"""Tasks for the task worker's tests.

Tasks that take ``mark`` append one line to that file each time they run
(``NAME PID``), so a test can count runs and tell workers apart.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

try:  # Django 6.0 and later
    from django.tasks import task, task_backends
except ImportError:  # Django 5.2: the django-tasks package
    from django_tasks import task, task_backends


def task_backend() -> Any:
    """The ``default`` task backend of this process's settings."""
    return task_backends["default"]


def _mark(path: str | None, name: str) -> None:
    if path:
        with open(path, "a") as f:  # one short append: whole lines even across processes
            f.write(f"{name} {os.getpid()}\n")


@task()
def add(a: int, b: int, mark: str | None = None) -> int:
    _mark(mark, "add")
    return a + b


@task()
async def async_add(a: int, b: int, mark: str | None = None) -> int:
    await asyncio.sleep(0)
    _mark(mark, "async_add")
    return a + b


@task(takes_context=True)
def with_context(context: Any, mark: str | None = None) -> dict[str, Any]:
    _mark(mark, "with_context")
    return {"attempt": context.attempt, "id": context.task_result.id}


@task()
def not_json() -> datetime:
    return datetime.now(tz=UTC)


@task()
def fail(mark: str | None = None) -> None:
    _mark(mark, "fail")
    raise ValueError("boom")


@task()
async def async_fail(mark: str | None = None) -> None:
    _mark(mark, "async_fail")
    raise KeyError("async boom")


@task()
def record(label: str, mark: str) -> str:
    _mark(mark, label)
    return label


@task()
def block(mark: str, release: str) -> str:
    """Runs until the file ``release`` exists (at most a minute)."""
    _mark(mark, "start")
    deadline = time.monotonic() + 60
    while not Path(release).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.05)
    _mark(mark, "end")
    return "released"


#: For in-process tests: ``gated`` returns once this is set; RUNS counts its runs by name.
GATE = threading.Event()
RUNS: Counter[str] = Counter()


@task()
async def gated(name: str) -> str:
    RUNS[name] += 1
    while not GATE.is_set():
        await asyncio.sleep(0.01)
    return name


@task()
def steps(n: int, release: str | None = None) -> str:
    """Reports ``{"step": i}`` for each of ``n`` steps, then waits for ``release`` if given."""
    from gateway.tasks import progress

    for i in range(n):
        progress({"step": i})
    deadline = time.monotonic() + 60
    while release and not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"{n} steps"


@task()
async def async_until_cancelled(mark: str) -> str:
    """Reports once, then sleeps until cancelled (a minute at most)."""
    from gateway.tasks import progress

    progress("waiting")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        _mark(mark, "async-cancelled")
        raise
    return "not cancelled"


@task()
def sync_until_cancelled(mark: str) -> str:
    """Reports once, then polls ``cancelled()`` until it is true (a minute at most)."""
    from gateway.tasks import cancelled, progress

    progress("waiting")
    deadline = time.monotonic() + 60
    while not cancelled() and time.monotonic() < deadline:
        time.sleep(0.05)
    _mark(mark, "sync-saw-cancelled" if cancelled() else "sync-timed-out")
    return "stopped"


@task()
def sync_ignores_cancel(release: str) -> str:
    """Reports once, then runs until the file ``release`` exists, whatever happens."""
    from gateway.tasks import progress

    progress("busy")
    deadline = time.monotonic() + 60
    while not Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return "finished anyway"
