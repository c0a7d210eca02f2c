"""Progress lines for a streaming job: Spark's progress reports in, text out.

Pure: it reads the dicts Spark's ``StreamingQuery.recentProgress`` returns
(``batchId``, ``numInputRows``, ``durationMs``) and keeps its own totals, so
it is tested without Spark. Each batch is reported once, however often the
same report is seen again.

A batch that an earlier run of the job planned but did not finish is run
again from the checkpoint when the job restarts (Spark replays it; the
sink's staged transaction makes the replay write nothing twice). Its rows
belong to that earlier run: they are reported as a replay and are not
counted toward this run's totals, so ``--stop-after-rows`` means rows this
run brought.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ProgressReport"]


@dataclass
class ProgressReport:
    """Totals over the batches seen so far, and one line per new batch.

    Args:
        started: the clock reading (seconds) the job started at; rates since
            the start are measured from it.
        replayed: ids of batches an earlier run planned and did not finish
            (read from the checkpoint at the start): reported, not counted.
    """

    started: float
    replayed: frozenset[int] = frozenset()
    batches: int = 0
    rows: int = 0
    _seen: set[int] = field(default_factory=set)

    def update(self, reports: Iterable[Mapping[str, Any]], now: float) -> list[str]:
        """Lines for the batches in ``reports`` not reported before, oldest first."""
        lines = []
        for report in sorted(reports, key=lambda r: int(r["batchId"])):
            batch = int(report["batchId"])
            if batch in self._seen:
                continue
            self._seen.add(batch)
            rows = int(report.get("numInputRows") or 0)
            if rows == 0:
                continue  # an idle trigger: nothing was written
            seconds = float((report.get("durationMs") or {}).get("triggerExecution", 0)) / 1000
            if batch in self.replayed:
                lines.append(
                    f"batch {batch}: {rows:,} rows replayed from the checkpoint in "
                    f"{seconds:.2f} s (an earlier run began this batch; nothing is "
                    "written twice; not counted here)"
                )
                continue
            self.batches += 1
            self.rows += rows
            batch_rate = f"{rows / seconds:,.0f} rows/s" if seconds > 0 else "-"
            lines.append(
                f"batch {batch}: {rows:,} rows in {seconds:.2f} s ({batch_rate}); "
                f"total {self.rows:,} rows in {self.batches} batches, "
                f"{self.rate(now):,.0f} rows/s since the start"
            )
        return lines

    def rate(self, now: float) -> float:
        """Rows per second since the start."""
        elapsed = now - self.started
        return self.rows / elapsed if elapsed > 0 else 0.0

    def summary(self, now: float) -> str:
        """The closing line."""
        return (
            f"done: {self.rows:,} rows in {self.batches} batches, "
            f"{now - self.started:.1f} s, {self.rate(now):,.0f} rows/s"
        )
