"""Summarise a ``py-spy record --format=raw`` file: where a process spent its samples.

    python -m bench.tasksite.profile FILE [--top 25]

Prints the functions with the most samples on top of the stack (self time)
and the source files with the most samples anywhere in the stack (inclusive
time, each file counted once a sample), as percentages of the samples.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

#: ``function (path:line)``; py-spy also writes ``process NNN:"cmdline"`` and
#: ``thread (0x...)`` frames at the root with --subprocesses / threads.
FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^():]+)(?::\d+)?\)$")


def summarise(path: Path, top: int = 25) -> str:
    """The two tables for ``path``, as text."""
    own: Counter[str] = Counter()
    files: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [m for m in (FRAME.match(f) for f in stack.split(";")) if m]
        if not frames:
            continue
        last = frames[-1]
        own[f"{last['func']} ({_short(last['path'])})"] += count
        for name in {_short(m["path"]) for m in frames}:
            files[name] += count
    out = [f"{path}: {total} samples", "", "self:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    out += ["", "inclusive, by file:"]
    out += [f"  {100 * n / total:5.1f}%  {name}" for name, n in files.most_common(top)]
    return "\n".join(out)


ROOT = str(Path(__file__).resolve().parents[2]) + "/"


def _short(path: str) -> str:
    for marker in ("site-packages/", ROOT, "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tasksite.profile")
    parser.add_argument("files", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    for path in args.files:
        print(summarise(path, args.top))
        print()


if __name__ == "__main__":
    main()
