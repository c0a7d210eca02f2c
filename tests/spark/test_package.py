"""The sink is its own distribution (clients/spark, ``leasecast-spark``), without Django.

Its wheel (``pip wheel --no-deps``; pip fetches setuptools to build it, and
without a package index that test is skipped, with the reason shown) holds ``spark_feed`` and
nothing of the gateway, and asks for the client and pyspark only; importing
the sink and the job (what executors and drivers do) loads no Django and no
gateway module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support.databases import ROOT
from tests.support.packaging import index_unreachable

PACKAGE = ROOT / "clients" / "spark"
FORBIDDEN = {"django", "channels", "daphne", "gateway", "consumers", "dashboard"}


def test_the_wheel_holds_the_sink_and_depends_on_the_client_and_pyspark_only(
    tmp_path: Path,
) -> None:
    reason = index_unreachable()  # pip fetches setuptools to build it
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("leasecast_spark-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = Parser().parsestr(
            archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        )
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith("-info")}
    assert packages == {"spark_feed"}, names
    assert "spark_feed/sink.py" in names and "spark_feed/py.typed" in names
    requires = metadata.get_all("Requires-Dist") or []
    assert {r.split(">")[0].split("[")[0].strip() for r in requires} == {"leasecast", "pyspark"}
    assert any(r.startswith("pyspark[sql]") for r in requires), requires


def test_importing_the_sink_and_the_job_loads_no_django_and_no_gateway() -> None:
    code = (
        "import json, sys, spark_feed.sink, spark_feed.job\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "pyspark" in loaded and "leasecast" in loaded
    assert not loaded & FORBIDDEN, loaded & FORBIDDEN
