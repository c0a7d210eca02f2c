"""A program the tests run in a process group of its own, its output in a file."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["LoggedProcess"]


class LoggedProcess:
    """``command`` started in its own session (so ``kill -9`` reaches all it
    started: a Spark driver's JVM and Python workers), stdout and stderr in ``log``.

    Args:
        command: the program and its arguments.
        log: the file its output goes to.
        what: what it is, for the message of :meth:`wait` ("the job").
        cwd, env: as for :class:`subprocess.Popen`.
    """

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        *,
        what: str,
        cwd: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.log = log
        self.what = what
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                list(command),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """``kill -9`` of the whole process group: no shutdown of any kind."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def wait(self, timeout: float = 300) -> int:
        """Its exit code; killed, and an ``AssertionError``, past ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.what} did not finish:\n{self.output()[-3000:]}") from None
