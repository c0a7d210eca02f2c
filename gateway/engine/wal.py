"""SQLite's WAL checkpoints, moved off the store thread's commits.

In WAL mode SQLite appends each commit to the ``-wal`` file, and by default
the commit that takes the log past 1,000 pages also copies the log back into
the database file and syncs both (a checkpoint): a few milliseconds, paid by
whichever operation of the store thread happens to commit then, and by every
enqueue and delivery queued behind it. That was one of the causes of the
paced latency's tail on SQLite (docs/benchmarks.md).

So the store's own connections turn automatic checkpoints off
(:data:`NO_AUTOCHECKPOINT`), and a :class:`WalCheckpointer` thread of the
process runs a ``PASSIVE`` checkpoint on a connection of its own every
:data:`INTERVAL` seconds. A passive checkpoint never waits for a lock and never
stops a writer: the store thread goes on committing while the pages are
copied. Nothing about durability changes: a commit is as safe in the log as
in the database file (``synchronous=NORMAL`` survives a crash of the
process; ``FULL`` syncs the log at each commit as before).

A Django connection that enqueues (``task.enqueue()``, ``gateway.enqueue``,
the admin's actions: ``gateway.host.on_django``) would otherwise run the
checkpoint inside the enqueue's commit whenever the log has passed 1,000
pages, which made an enqueue's p99 on SQLite 2.5 ms longer than its p98
(docs/benchmarks.md, Tasks). So :func:`leave_checkpoints_to_gateways` turns
that connection's automatic checkpoints off while a gateway process serves
the file, whose checkpointer then does them, and gives it back its own
setting when none does (the log must not grow without a checkpointer). The
project's other connections keep their setting.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from django.db import connections

__all__ = ["INTERVAL", "NO_AUTOCHECKPOINT", "WalCheckpointer", "leave_checkpoints_to_gateways"]

log = logging.getLogger("leasecast.store")

#: Seconds between two checkpoints. At the store's highest rates the log then
#: grows by some megabytes between them; at rest a checkpoint finds nothing to
#: do. Every checkpoint syncs the database file, which slows the commits that
#: meet it: at 0.5 s the paced latency's p50 was worse than with SQLite's own
#: checkpoints, at 2 s both p50 and p99 were better (docs/benchmarks.md).
INTERVAL = 2.0
#: Run on a store connection: no checkpoint inside its commits.
NO_AUTOCHECKPOINT = "PRAGMA wal_autocheckpoint=0"


class WalCheckpointer:
    """A daemon thread that checkpoints the default SQLite database's log.

    Args:
        interval: seconds between checkpoints.
    """

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leasecast-wal", daemon=True)

    def start(self) -> WalCheckpointer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop after the checkpoint under way, if any (it is not waited for)."""
        self._stop.set()

    def checkpoint(self, conn: Any) -> None:
        """One passive checkpoint on ``conn``."""
        busy, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if busy:  # another checkpoint was under way (another process's): next time
            log.debug("WAL checkpoint skipped: another one runs (%s frames)", frames)

    def _run(self) -> None:
        wrapper: Any = None
        while not self._stop.wait(self.interval):
            try:
                if wrapper is None:
                    # A connection of its own, with the project's options (path,
                    # busy timeout), as the store's.
                    wrapper = connections.create_connection("default")
                    wrapper.ensure_connection()
                self.checkpoint(wrapper.connection)
            except Exception as exc:
                # The database may be briefly unavailable (a file being
                # replaced in a test, a full disk): the store reports that
                # itself. Try again later on a fresh connection.
                log.warning("WAL checkpoint failed: %s", exc)
                if wrapper is not None:
                    with contextlib.suppress(Exception):  # it failed already
                        wrapper.close()
                    wrapper = None
                time.sleep(self.interval)
        if wrapper is not None:
            wrapper.close()


def leave_checkpoints_to_gateways(wrapper: Any, cursor: Any, *, gateways: bool) -> None:
    """Before Django connection ``wrapper`` (on SQLite) writes to the store: no
    automatic checkpoint in its commits while a gateway process serves the
    file (``gateways``: :func:`gateway.engine.notify.listening` found one), the
    connection's own setting otherwise.

    The setting is read once per database connection and changed only when
    the answer changes (a PRAGMA, outside the transaction's data).
    """
    raw = wrapper.connection
    state = getattr(wrapper, "_leasecast_autocheckpoint", None)
    if state is None or state[0] is not raw:  # a new connection: its own setting
        cursor.execute("PRAGMA wal_autocheckpoint")
        (own,) = cursor.fetchone()
        state = wrapper._leasecast_autocheckpoint = [raw, own, own]
    wanted = 0 if gateways else state[1]
    if wanted != state[2]:
        cursor.execute(f"PRAGMA wal_autocheckpoint={int(wanted)}")
        state[2] = wanted
