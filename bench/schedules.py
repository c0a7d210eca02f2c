"""What schedules cost: one gateway process firing many ``every: 1`` schedules.

    python -m bench.schedules                                # SQLite and PostgreSQL, ~1 minute
    python -m bench.schedules --backends sqlite --schedules 200 --seconds 5   # a smoke run

One gateway (daphne, as the tests start it) per backend, on a database of its
own. ``--schedules`` schedules with ``every: 1`` into one queue are written
at once (``bulk_create``), so every second each of them has a tick. After
``--warmup`` seconds, for ``--seconds`` seconds: the gateway process's CPU
(all threads, ``/proc``), the ticks fired (the sum of the schedules'
``fired``), and for each message of the window the lag from its tick to its
enqueue (``enqueued_at`` against the tick in its key). Reported: ticks per
second against the schedules' due rate, CPU share of one core, CPU
milliseconds per 1,000 ticks, and the lag's median, 99th percentile and
maximum. Nothing else runs on the gateway: this is the loop's own cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.procstat import loadavg, process_cpu_seconds
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess

QUEUE = "bench-schedules"


def _connect(env: dict[str, str]) -> Any:
    if "DATABASE_URL" in env:
        import psycopg

        return psycopg.connect(env["DATABASE_URL"], autocommit=True)
    import sqlite3

    return sqlite3.connect(env["GATEWAY_SQLITE_PATH"], isolation_level=None)


def _fired(conn: Any) -> int:
    return int(conn.execute("SELECT COALESCE(SUM(fired), 0) FROM leasecast_schedule").fetchone()[0])


def _lags(conn: Any, since: float, until: float) -> list[float]:
    rows = conn.execute(
        "SELECT m.key, m.enqueued_at FROM leasecast_message AS m "
        "JOIN leasecast_queue AS q ON q.id = m.queue_id WHERE q.name = "
        + ("%s" if type(conn).__module__.startswith("psycopg") else "?"),
        (QUEUE,),
    ).fetchall()
    lags = []
    for key, enqueued_at in rows:
        tick = datetime.fromisoformat(key.split(":", 2)[2].replace("Z", "+00:00")).timestamp()
        if since <= tick < until:
            lags.append(enqueued_at - tick)
    return lags


def run(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with ExitStack() as stack:
        var = Path(tempfile.mkdtemp(prefix=f"bench-schedules-{backend}-"))
        env = stack.enter_context(
            sqlite_database(var) if backend == "sqlite" else postgres_database(var)
        )
        gw = GatewayProcess(env, var, name="bench")
        gw.start()
        stack.callback(gw.stop)
        assert gw.proc is not None
        gw.manage(
            "shell",
            "-c",
            "import time; from gateway.models import Schedule; now = time.time(); "
            "Schedule.objects.bulk_create([Schedule(name=f'b{i}', queue="
            f"{QUEUE!r}, every=1, active_since=now) for i in range({args.schedules})])",
        )
        conn = _connect(env)
        stack.callback(conn.close)
        time.sleep(args.warmup)
        start, cpu0, fired0 = time.time(), process_cpu_seconds(gw.proc.pid), _fired(conn)
        load0 = loadavg()
        time.sleep(args.seconds)
        end, cpu1, fired1 = time.time(), process_cpu_seconds(gw.proc.pid), _fired(conn)
        elapsed = end - start
        ticks = fired1 - fired0
        lags = sorted(_lags(conn, start + 1, end - 1))
        return {
            "backend": backend,
            "schedules": args.schedules,
            "seconds": round(elapsed, 1),
            "ticks_per_s": round(ticks / elapsed, 1),
            "due_per_s": args.schedules,
            "cpu_share": round((cpu1 - cpu0) / elapsed, 3),
            "cpu_ms_per_1000_ticks": round(1e6 * (cpu1 - cpu0) / max(ticks, 1), 1),
            "lag_median_s": round(statistics.median(lags), 3) if lags else None,
            "lag_p99_s": round(lags[int(0.99 * (len(lags) - 1))], 3) if lags else None,
            "lag_max_s": round(lags[-1], 3) if lags else None,
            "loadavg_1m": load0,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = []
    for backend in args.backends:
        if backend == "postgres" and (reason := postgres_unavailable()):
            print(f"postgres skipped: {reason}")
            continue
        row = run(backend, args)
        rows.append(row)
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
