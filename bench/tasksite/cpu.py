"""CPU seconds used by groups of processes, read from ``/proc`` (Linux).

The task benchmark says where each system spends its CPU per task (the
machine has 2 cores: what the producer, the broker and the workers burn
decides the rate). A group is a set of processes found again at every
reading: given pids and their descendants (Celery's prefork children), or
every process whose command line contains a string (PostgreSQL's backends
show their database's name there). A process that exits between two
readings takes its CPU with it; the benchmark's processes live throughout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), 0 if it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 is fields[0]
    return (int(fields[11]) + int(fields[12])) / TICKS


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in (PROC / str(current) / "task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def by_cmdline(text: str) -> list[int]:
    """Every process whose command line contains ``text``."""
    needle = text.encode()
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def trees(pids: Iterable[int]) -> Callable[[], list[int]]:
    """A group: ``pids`` and their descendants, found again at each reading."""
    roots = list(pids)
    return lambda: [p for root in roots for p in descendants(root)]


def matching(text: str) -> Callable[[], list[int]]:
    """A group: the processes whose command line contains ``text``."""
    return lambda: by_cmdline(text)


class Meter:
    """CPU seconds of named groups of processes between readings."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups

    def read(self) -> dict[str, float]:
        """Each group's total CPU seconds so far."""
        return {name: sum(cpu_seconds(p) for p in find()) for name, find in self.groups.items()}
