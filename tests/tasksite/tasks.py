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
