"""The runtime wires its parts explicitly (issue 23.5): it owns the process's
metrics and the parts the site registers (the dashboard's exchange); nothing
starts a thread on import or first use."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest
import redis

from gateway.runtime import Runtime
from gateway.runtime.metrics import ProcessMetrics, Registry
from gateway.store import Store

REDIS_URL = os.environ.get("LEASECAST_TEST_REDIS", "redis://127.0.0.1:6379/0")


def _no_store() -> Store:
    raise AssertionError("these tests run no store operation")


class Part:
    """A part of a layer above the runtime, as the dashboard's exchange is."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_the_runtime_builds_the_registered_parts_and_closes_them() -> None:
    runtime = Runtime(make_store=_no_store, parts=[Part])
    try:
        part = runtime.part(Part)
        assert part.runtime is runtime and not part.closed
        with pytest.raises(LookupError, match="runs no Registry"):
            runtime.part(Registry)
    finally:
        await runtime.aclose()
    assert part.closed


async def test_the_runtime_hands_its_metrics_to_what_counts() -> None:
    runtime = Runtime(make_store=_no_store, parts=[])
    try:
        assert runtime.broadcaster.meter is runtime.metrics.registry
        runtime.broadcaster.meter.topic_published("prices", 3)
        assert runtime.metrics.registry.totals() == {("topic_published", ("prices",)): 3}
    finally:
        await runtime.aclose()


def test_importing_and_counting_start_no_thread() -> None:
    # A fresh interpreter, configured for Redis (which the metrics are shared
    # through): other tests' threads do not count. The old module started its
    # sharing thread on the first count.
    code = (
        "import threading, django\n"
        "django.setup()\n"
        "from gateway.runtime import metrics\n"
        "registry = metrics.Registry('p:1')\n"
        "registry.topic_published('t'); registry.socket_opened('worker')\n"
        "print(threading.active_count())\n"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gateway.settings", "REDIS_URL": REDIS_URL}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert done.stdout.strip() == "1"


def test_sharing_through_redis_starts_and_stops_with_its_owner() -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")
    figures = ProcessMetrics.for_settings(REDIS_URL, "leasecast-test-wiring")
    assert figures.share is not None
    named = [t for t in threading.enumerate() if t.name == "leasecast-metrics"]
    figures.start()
    sharer: Any = figures._sharer
    assert sharer is not None and sharer.is_alive()
    assert (
        len([t for t in threading.enumerate() if t.name == "leasecast-metrics"]) == len(named) + 1
    )
    figures.close()
    sharer.join(30)
    assert not sharer.is_alive()
