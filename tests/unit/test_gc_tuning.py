"""The standalone service tunes the garbage collector (GATEWAY_GC_THRESHOLD)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import gc, gateway.asgi; print(gc.get_threshold()[0], gc.get_freeze_count() > 0, flush=True)"
)


def threshold_after_import(value: str | None) -> tuple[int, bool]:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_GC_THRESHOLD"}
    env["DJANGO_SETTINGS_MODULE"] = "gateway.settings"
    if value is not None:
        env["GATEWAY_GC_THRESHOLD"] = value
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return int(out[0]), out[1] == "True"


def test_the_service_collects_less_often_and_freezes_what_startup_built() -> None:
    assert threshold_after_import(None) == (10_000, True)
    assert threshold_after_import("25000") == (25_000, True)


def test_zero_leaves_pythons_collector_alone() -> None:
    assert threshold_after_import("0") == (700, False)
