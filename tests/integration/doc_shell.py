"""Run a doc's ``sh`` blocks as written: commands typed into one bash, in order.

Used by the tests that hold the README and docs/ to "every command runs as
written" (tests/integration/test_readme_tour.py, tests/spark/test_doc_commands.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from tests.support.databases import ROOT

MARK = "__doc_shell_done__"


def sh_commands(path: Path, heading: str) -> list[str]:
    """The commands of the ``sh`` blocks under ``heading`` (a ``##`` or ``###``
    line of ``path``, up to the next heading of that level or above), comment
    lines dropped and continuation lines joined."""
    lines = path.read_text().splitlines(keepends=True)
    level = len(heading.split(" ", 1)[0])
    start = lines.index(heading + "\n")
    end, fenced = len(lines), False
    for number in range(start + 1, len(lines)):
        line = lines[number]
        fenced ^= line.lstrip().startswith("```")
        # A heading of this level or above ends the section; "# ..." in a code block does not.
        marks = len(line) - len(line.lstrip("#"))
        if not fenced and 1 <= marks <= level and line[marks : marks + 1] == " ":
            end = number
            break
    section = "".join(lines[start:end])
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.DOTALL):
        pending = ""
        for raw in block.splitlines():
            line = raw.strip()
            if not pending and (not line or line.startswith("#")):
                continue
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            commands.append(pending + line)
            pending = ""
    return commands


class Shell:
    """One bash reading commands as a terminal would; background jobs share its output."""

    def __init__(self, env: dict[str, str], log: Path, cwd: Path = ROOT) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._seen = 0
        self.runs = 0

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def run(self, command: str, timeout: float = 120) -> str:
        """Type ``command``; its output (and any background job's meanwhile).

        Raises:
            AssertionError: it exited non-zero or did not finish in time.
        """
        assert self.proc.stdin is not None
        self.runs += 1
        marker = f"{MARK} {self.runs}"
        # The status is kept before anything else runs: ``echo; echo $?`` would
        # report the first echo's 0, whatever the command did.
        self.proc.stdin.write(f'{command}\n__doc_status=$?; echo; echo "{marker} $__doc_status"\n')
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while marker not in self.text():
            assert time.monotonic() < deadline, f"{command!r} did not finish:\n{self.text()}"
            time.sleep(0.05)
        text = self.text()
        end = text.index(marker)
        while "\n" not in text[end:]:  # the status after the marker is still coming
            text = self.text()
        output, self._seen = text[self._seen : end], text.index("\n", end) + 1
        status = text[end + len(marker) :].split()[0]
        assert status == "0", f"{command!r} exited {status}:\n{output}"
        return output

    def close(self) -> None:
        # Ends the tour's background jobs too: they are in the shell's session.
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        self._out.close()


def without_comment(command: str) -> str:
    """``command`` without its trailing shell comment (`` # ...`` outside quotes)."""
    quote = ""
    for index, char in enumerate(command):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or command[index - 1].isspace()):
            return command[:index].rstrip()
    return command


def in_background(command: str) -> str:
    """``command`` as a job of its own (`` &``), for a server a doc starts and
    leaves running; its trailing comment (which would swallow the ``&``) dropped."""
    return without_comment(command) + " &"
