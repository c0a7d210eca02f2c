"""The efficiency and Spark benchmarks work (tiny sizes; no timing is asserted).

A whole ``bench.spark`` run takes over a minute even at tiny sizes (a Spark
session and six streaming queries), so its parts are tested here instead:
the per-partition POST against a real gateway, and the price-of-exactly-once
table.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest

from bench.echo_app import application
from bench.efficiency import EchoProcess, summarise_raw
from bench.spark import Result as SparkResult
from bench.spark import partition_poster, price_of_exactly_once
from bench.spark import table as spark_table
from bench.workqueue import LeasecastTarget
from tests.support.clients import http
from tests.support.databases import ROOT
from tests.support.gateways import sqlite_gateway


def bench(*args: str, timeout: float) -> str:
    """``python -m bench.NAME ARGS`` from the repository root; its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def test_echo_app_answers_the_five_frames_of_a_cycle() -> None:
    """Served by daphne like the gateway: enqueued, deliver (same shape), acked."""
    assert callable(application)
    var = Path(tempfile.mkdtemp(prefix="leasecast-echo-test-"))
    echo = EchoProcess(dict(os.environ), var, name="echo-test")
    echo.start()
    try:
        client = LeasecastTarget("echo", echo, "unused")
        async with (
            await client.socket("/ws/queues/q/?prefetch=1") as worker,
            await client.socket("/ws/produce/") as producer,
        ):
            await producer.send('{"op":"enqueue","queue":"q","body":{"t":1}}')
            await producer.send('{"op":"enqueue","queue":"q","body":{"t":2}}')
            assert orjson.loads(await producer.recv())["op"] == "enqueued"
            first = orjson.loads(await worker.recv())
            assert first["op"] == "deliver" and first["body"] == {"t": 1}
            assert set(first) >= {"queue", "id", "receipt", "deliveries", "expires_in"}
            await worker.send(f'{{"op":"ack","receipt":"{first["receipt"]}"}}')
            assert orjson.loads(await worker.recv()) == {"op": "acked"}
            # prefetch=1: the second delivery waited for the ack.
            second = orjson.loads(await worker.recv())
            assert second["body"] == {"t": 2}
    finally:
        echo.stop()


def test_efficiency_bench_runs_and_prints_its_ratio() -> None:
    out = bench(
        "bench.efficiency",
        *("--servers", "daphne", "--cycles", "300", "--rounds", "1"),
        timeout=120,
    )
    assert "| daphne | gateway |" in out and "| daphne | echo |" in out
    assert "gateway / echo cycles/s" in out


def test_clientpath_bench_runs_the_client_default_and_v1_paths() -> None:
    """Both client paths complete every cycle (RabbitMQ joins when it is reachable)."""
    out = bench(
        "bench.clientpath",
        *("--backends", "sqlite,rabbitmq", "--messages", "300", "--rounds", "1"),
        *("--latency-messages", "100", "--latency-rounds", "1", "--no-serial"),
        timeout=120,
    )
    assert "| sqlite | default |" in out and "| sqlite | v1 |" in out
    assert "Target: sqlite: default path" in out


def test_js_client_bench_receives_and_resumes_with_no_gap() -> None:
    """JS (Chromium) and Python subscribers receive everything, resume with no gap or drop."""
    from bench.js_client import browser_missing

    missing = browser_missing()
    if missing is not None:
        pytest.skip(f"the JS client bench needs Chromium: {missing}")
    out = bench(
        "bench.js_client",
        *("--messages", "1000", "--missed", "500", "--rounds", "1", "--backoff", "1000"),
        timeout=120,
    )
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    received = {cells[0].strip(): cells for cells in rows if cells[0].strip() in ("js", "python")}
    resumed = [cells for cells in rows if cells[0].strip() in ("forced", "reopen")]
    # Throughput: nothing dropped, nothing out of order (the last two columns).
    assert set(received) == {"js", "python"}, out
    assert all([c.strip() for c in cells[-2:]] == ["0", "0"] for cells in received.values()), out
    # Both resumes of both clients ended, each without a gap or duplicate.
    assert len(resumed) == 4, out
    assert all(cells[-1].strip() == "0" for cells in resumed), out


def test_profile_summary_reads_py_spy_raw_output(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "run (daphne/server.py:1);select (selectors.py:468) 3\n"
        "run (daphne/server.py:1);_ack (consumers/worker.py:194) 1\n"
        "_bootstrap (threading.py:1002);exec (gateway/store/txn.py:9) 4\n"
    )
    summary = summarise_raw(raw)
    assert summary["samples"] == 8
    assert dict(summary["components"]) == {
        "asyncio": 3 / 8,
        "gateway: consumers/": 1 / 8,
        "gateway: store/ (SQL)": 4 / 8,
    }
    assert dict(summary["threads"]) == {"loop thread": 0.5, "other threads": 0.5}


def test_partition_poster_posts_a_partition_in_requests_of_the_limit() -> None:
    """The fair Spark baseline's per-partition POST, against a real gateway (no JVM needed)."""
    row_type = pytest.importorskip("pyspark.sql", reason="pyspark is not installed").Row
    with sqlite_gateway("bench-smoke") as gateway:
        token = gateway.issue_token("admin", name="bench")
        post = partition_poster(gateway.http, token, "smoke", limit=3)
        post(iter([row_type(id=i, name=f"row {i}") for i in range(7)]))  # 3 requests
        status, stats = http("GET", f"{gateway.http}/api/queues/smoke", token)
        assert status == 200 and stats["visible"] == 7
        status, page = http("GET", f"{gateway.http}/api/queues/smoke/messages", token)
        assert status == 200
        bodies = [m["body"] for m in page["messages"]]
        assert bodies == [{"id": i, "name": f"row {i}"} for i in range(7)]


def test_spark_table_reports_the_price_of_exactly_once() -> None:
    results = [
        SparkResult("leasecast-sink", 1000, 2.0, 1),
        SparkResult("foreachbatch-partition-post", 1000, 1.0, 1),
        SparkResult("leasecast-sink", 1000, 1.0, 1),
        SparkResult("foreachbatch-partition-post", 1000, 1.0, 1),
        SparkResult("foreachbatch-post", 10, 1.0, 1),
    ]
    assert price_of_exactly_once(results) == [0.5, 1.0]
    text = spark_table(results)
    assert "median 0.75 (per round: 0.50, 1.00" in text
    assert "| foreachbatch-partition-post | 1,000 | 1 | 1.0 | 1,000 | 100.0x |" in text


def test_topics_bench_resumes_in_order_and_completes_every_round() -> None:
    """``bench.topics --quick``: each resume recovered, every offset once; no round short."""
    from tests.support.databases import postgres_unavailable, redis_unavailable

    reason = postgres_unavailable() or redis_unavailable()
    if reason:
        pytest.skip(reason)
    out = bench(
        "bench.topics",
        *("--quick", "--history-on", "embedded", "--paced-seconds", "0.3"),
        timeout=120,
    )
    for name in ("embedded", "redis-one", "redis-two"):
        assert f"| {name} | 1 | " in out and f"| {name} | " in out.split("3. Deployments")[1]
    assert "| embedded | 10,000 | 1 |" in out  # the history-on arm ran
    assert "history on / off = **" in out
    assert "RESUME PROBLEMS" not in out and "INCOMPLETE" not in out, out


def test_headline_bench_quick_measures_every_system_that_answers(tmp_path: Path) -> None:
    """``bench.headline --quick``, smaller still: a row per system, or why it was skipped."""
    from bench.headline import FANOUT_ORDER, QUEUE_ORDER, RESUME_ORDER

    out_json = tmp_path / "headline.json"
    out = bench(
        "bench.headline",
        *("--quick", "--cycles", "400", "--latency-messages", "100"),
        *("--subscribers", "5", "--fanout-messages", "50", "--missed", "300"),
        *("--json", str(out_json)),
        timeout=280,
    )
    data = orjson.loads(out_json.read_bytes())
    skipped = data["skipped"]
    # The gateway on SQLite always answers: its two client paths always have rows.
    assert not {"leasecast-sqlite", "leasecast-sqlite-v1"} & set(skipped), skipped
    for name in QUEUE_ORDER:
        samples = [r for r in data["samples"] if r["system"] == name]
        paced = [r for r in data["latencies"] if r["system"] == name]
        if name in skipped:
            assert skipped[name] and not samples, (name, skipped[name])
            continue
        assert len(samples) == 1 and samples[0]["cycles"] == 400, (name, samples)
        assert samples[0]["cycles_per_s"] > 0 and samples[0]["client_us_per_cycle"] > 0
        assert len(paced) == 1 and paced[0]["messages"] == 100, (name, paced)
        assert f"| {name} | " in out and name in data["durability"]
    for name in FANOUT_ORDER:
        rows = [r for r in data["fanout"] if r["system"] == name]
        if name in skipped:
            assert skipped[name] and not rows, (name, skipped[name])
            continue
        assert len(rows) == 1 and rows[0]["delivered"] > 0, (name, rows)
        if name.startswith("leasecast"):  # buffers as large as the run: nothing dropped
            assert rows[0]["delivered"] == 5 * 50, rows
    # The embedded gateway always answers; the rest may be skipped, with the reason.
    assert "leasecast-embedded" not in skipped, skipped
    for name in RESUME_ORDER:
        rows = [r for r in data["resume"] if r["system"] == name]
        if name in skipped:
            assert skipped[name] and not rows, (name, skipped[name])
            continue
        # Every missed message read back, each once and in order.
        assert len(rows) == 1 and rows[0]["received"] == 300 and rows[0]["in_order"], rows
        assert f"| {name} | " in out and name in data["durability"]
    # The gateway's CPU comes from /proc: it is always there.
    gateway = next(r for r in data["samples"] if r["system"] == "leasecast-sqlite")
    assert gateway["server_us_per_cycle"] is not None


def test_headline_tables_replace_what_lies_between_the_markers(tmp_path: Path) -> None:
    """A rerun replaces the tables in docs/benchmarks.md; the text around them stays."""
    from bench.headline import BEGIN, END, write_docs

    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nbefore\n\n{BEGIN}\nold tables\n{END}\n\nafter\n")
    write_docs(doc, "| first | run |")
    write_docs(doc, "| second | run |")
    text = doc.read_text()
    assert text == f"# Benchmarks\n\nbefore\n\n{BEGIN}\n| second | run |\n{END}\n\nafter\n"
    assert BEGIN in (ROOT / "docs/benchmarks.md").read_text()


def test_a_peer_whose_server_does_not_answer_is_skipped_with_the_reason() -> None:
    """NATS and Mosquitto pointed at a port nobody listens on: the run goes on without them."""
    from tests.support.gateways import free_port

    port = str(free_port())
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bench.headline", "--quick", "--cycles", "200"),
            *("--latency-messages", "50", "--json", os.devnull),
            *("--systems", "leasecast-sqlite,nats-jetstream,nats-core,mosquitto-qos0"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"LEASECAST_BENCH_NATS_PORT": port, "LEASECAST_BENCH_MQTT_PORT": port},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name, what in [("nats-jetstream", "NATS"), ("nats-core", "NATS")]:
        assert f"skipped {name}: {what} at 127.0.0.1:{port} is not reachable" in done.stderr
    assert f"skipped mosquitto-qos0: Mosquitto (MQTT) at 127.0.0.1:{port}" in done.stderr
    assert "| leasecast-sqlite | " in done.stdout and "Skipped: nats-jetstream: NATS" in done.stdout
