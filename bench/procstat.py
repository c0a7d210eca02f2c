"""CPU and load readings from ``/proc``, shared by the benchmarks.

Every benchmark reports CPU per unit of work (which depends little on who
else uses the cores) beside its rates (which depend a lot), and what the
rest of the machine used meanwhile: these are the readings behind both.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "CLOCK_TICKS",
    "children_of",
    "cpu_of",
    "loadavg",
    "machine_busy_seconds",
    "pids_named",
    "process_cpu_seconds",
    "tree_cpu_seconds",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int, tid: int | None = None, *, children: bool = False) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (or
    thread ``tid``); with ``children``, also its reaped children's.

    Raises:
        OSError: the process is gone.
    """
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    text = Path(path).read_text()
    fields = text[text.rindex(")") + 2 :].split()
    # After "pid (comm) ": utime, stime, cutime, cstime are fields 14-17 of proc(5).
    return sum(int(v) for v in fields[11 : 15 if children else 13]) / CLOCK_TICKS


def cpu_of(pids: Iterable[int], *, children: bool = False) -> float:
    """CPU seconds of ``pids`` so far, the ones that still exist."""
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_seconds(pid, children=children)
        except OSError:
            continue
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far (all cores, from ``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def loadavg() -> str:
    """The first three fields of ``/proc/loadavg``."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pids_named(comm: str) -> list[int]:
    """The processes whose command name (``/proc/PID/comm``) is ``comm``; may be empty."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == comm:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def parent_of(pid: int) -> int:
    """The parent process id of ``pid`` (0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text[text.rindex(")") + 2 :].split()[1])


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid``."""
    return [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid
    ]


def tree_cpu_seconds(parent: int) -> float:
    """CPU seconds of ``parent``, its reaped children and its live children so far.

    A server that forks a process per connection (PostgreSQL) is counted
    whole this way: a child that exits between two readings moves from the
    live sum into the parent's reaped-children time, so differences stay right.
    """
    try:
        own = process_cpu_seconds(parent, children=True)
    except OSError:
        return 0.0
    return own + cpu_of(children_of(parent))
