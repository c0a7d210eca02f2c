"""The benchmark's Celery app: the same no-op task, Redis broker, Redis result backend.

``BENCH_CELERY_REDIS`` is the Redis URL of both (default
``redis://127.0.0.1:6379/0``). Celery's defaults otherwise (acks when a task
is received, prefetch multiplier 4), JSON, no events.
"""

from __future__ import annotations

import os
import time

from celery import Celery

REDIS = os.environ.get("BENCH_CELERY_REDIS", "redis://127.0.0.1:6379/0")

app = Celery("bench", broker=REDIS, backend=REDIS)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=3600,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.noop")  # type: ignore[untyped-decorator]  # Celery has no types
def noop() -> float:
    """Does nothing but return the time it started (Unix seconds), kept as its result."""
    return time.time()
