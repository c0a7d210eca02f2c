"""The example job's progress lines, fed Spark-shaped progress reports."""

from __future__ import annotations

from pathlib import Path

from spark_feed.job import unfinished_batches
from spark_feed.progress import ProgressReport


def report(batch: int, rows: int, ms: int = 500) -> dict[str, object]:
    return {"batchId": batch, "numInputRows": rows, "durationMs": {"triggerExecution": ms}}


def test_each_batch_is_reported_once_in_order() -> None:
    progress = ProgressReport(started=100.0)
    lines = progress.update([report(1, 300), report(0, 200)], now=101.0)
    assert [line.split(":")[0] for line in lines] == ["batch 0", "batch 1"]
    assert "200 rows in 0.50 s (400 rows/s)" in lines[0]
    assert "total 500 rows in 2 batches, 500 rows/s since the start" in lines[1]
    # Spark's recent progress repeats old reports: they are not counted again.
    assert progress.update([report(0, 200), report(1, 300), report(2, 500)], now=102.0) == [
        "batch 2: 500 rows in 0.50 s (1,000 rows/s); total 1,000 rows in 3 batches, "
        "500 rows/s since the start"
    ]
    assert progress.rows == 1000 and progress.batches == 3


def test_idle_triggers_and_missing_durations() -> None:
    progress = ProgressReport(started=0.0)
    assert progress.update([report(0, 0)], now=1.0) == []  # nothing written: no line
    (line,) = progress.update([{"batchId": 1, "numInputRows": 10}], now=2.0)
    assert "(-)" in line  # no duration reported: no per-batch rate
    assert progress.summary(now=2.0) == "done: 10 rows in 1 batches, 2.0 s, 5 rows/s"
    assert ProgressReport(started=5.0).rate(now=5.0) == 0.0


def test_a_batch_an_earlier_run_left_unfinished_is_shown_and_not_counted() -> None:
    # A restart replays it first; counting it let --stop-after-rows end the
    # second run before it brought anything new (CI, 2026-11-26).
    progress = ProgressReport(started=0.0, replayed=frozenset({3}))
    lines = progress.update([report(3, 1500), report(4, 600)], now=2.0)
    assert lines[0].startswith("batch 3: 1,500 rows replayed from the checkpoint")
    assert "total 600 rows in 1 batches" in lines[1]
    assert progress.rows == 600 and progress.batches == 1


def test_unfinished_batches_are_planned_offsets_without_a_commit(tmp_path: Path) -> None:
    assert unfinished_batches(tmp_path / "new") == frozenset()
    for folder, names in (("offsets", ["0", "1", "2", ".2.crc"]), ("commits", ["0", "1"])):
        (tmp_path / folder).mkdir()
        for name in names:
            (tmp_path / folder / name).write_text("")
    assert unfinished_batches(tmp_path) == frozenset({2})
