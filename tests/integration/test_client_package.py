"""The Python client is its own distribution: its wheel installs and runs without Django.

Builds ``clients/python`` into a wheel (``pip wheel --no-deps``), installs it
into a fresh virtualenv (no system site-packages, so nothing of this
project's environment leaks in), and checks there: ``import leasecast`` and
``from leasecast import Worker, Producer, Subscriber``, the ``leasecast``
console script's ``--help``, that Django is not importable, and that the
installed client really works a queue on a live gateway. pip fetches
``websockets`` and ``orjson`` (and setuptools to build) from the package
index: without one the tests are skipped, with the reason shown.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import unique
from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess
from tests.support.packaging import index_unreachable

CLIENT = ROOT / "clients" / "python"


def run(*args: str | Path, cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        # Nothing of this project's environment: the venv must stand alone.
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE", "VIRTUAL_ENV")
        },
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def client_venv() -> Iterator[Path]:
    """A fresh virtualenv with only the client's wheel (and its two dependencies)."""
    reason = index_unreachable()
    if reason:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="leasecast-wheel-") as tmp:
        wheels = Path(tmp) / "wheels"
        run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", wheels, CLIENT)
        (wheel,) = wheels.glob("leasecast-*.whl")
        env_dir = Path(tmp) / "venv"
        venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
        python = env_dir / "bin" / "python"
        run(python, "-m", "pip", "install", "--quiet", wheel)
        yield env_dir


def test_the_wheel_installs_and_runs_without_django(client_venv: Path) -> None:
    python = client_venv / "bin" / "python"
    # Run from a directory without the repository, so only the installed copy counts.
    out = run(
        python,
        "-c",
        "import importlib.util, leasecast;"
        "from leasecast import Worker, Producer, Subscriber, EnqueueResult;"
        "print(leasecast.__file__);"
        "print(importlib.util.find_spec('django'), importlib.util.find_spec('gateway'))",
        cwd=client_venv,
    )
    location, missing = out.splitlines()
    assert location.startswith(str(client_venv)), location
    assert missing == "None None"
    names = run(python, "-m", "pip", "list", "--format=freeze", cwd=client_venv)
    installed = {line.split("==")[0].lower() for line in names.splitlines()}
    assert {"leasecast", "websockets", "orjson"} <= installed
    assert not installed & {"django", "channels", "daphne", "psycopg"}, installed
    help_text = run(client_venv / "bin" / "leasecast", "--help", cwd=client_venv)
    assert "usage: leasecast" in help_text and "enqueue" in help_text


def test_the_installed_client_works_a_queue(client_venv: Path, gateway: GatewayProcess) -> None:
    token = gateway.issue_token("admin", name=unique("wheel"))
    q = unique("wheel")
    script = f"""
import asyncio
from leasecast import Producer, Worker

async def main():
    async with Producer({gateway.http!r}, token={token!r}) as producer:
        results = await asyncio.gather(*(producer.enqueue({q!r}, i) for i in range(3)))
    async with Worker({gateway.ws!r}, {q!r}, token={token!r}, prefetch=3) as worker:
        got = []
        async for delivery in worker:
            got.append(delivery.body)
            await delivery.ack()
            if len(got) == 3:
                break
    print(len({{r.id for r in results}}), sorted(got))

asyncio.run(main())
"""
    out = run(client_venv / "bin" / "python", "-c", script, cwd=client_venv, timeout=60)
    assert out.strip() == "3 [0, 1, 2]"
    enqueued = run(
        client_venv / "bin" / "leasecast",
        "--url",
        gateway.http,
        "--token",
        token,
        "stats",
        q,
        cwd=client_venv,
        timeout=60,
    )
    assert '"visible": 0' in enqueued
