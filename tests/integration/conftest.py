"""Gateway processes per backend: SQLite always, PostgreSQL when it answers.

The processes and databases come from :mod:`tests.support`; Redis (for the
scale-out tests) from the ``redis_url`` fixture of ``tests/conftest.py``.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.databases import (
    database,
    postgres_database,
    postgres_unavailable,
)
from tests.support.gateways import GatewayProcess, default_server


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database_env(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], Path]]:
    """A migrated database of each kind, and the var/ directory of its gateway."""
    with database(request.param) as found:
        yield found


@pytest.fixture(scope="module")
def gateway_server(request: pytest.FixtureRequest) -> str:
    """The ASGI server of ``gateway`` and ``own_gateway``: daphne (or ``$LEASECAST_TEST_SERVER``).

    A test runs under both with ``@both_servers`` (harness.py), which
    parametrises this fixture indirectly; the uvicorn variant then gets a
    gateway process of its own.
    """
    server = str(getattr(request, "param", None) or default_server())
    if server == "uvicorn" and importlib.util.find_spec("uvicorn") is None:
        # The Django 6 run installs the test extra only (Makefile test-django6).
        pytest.skip("uvicorn is not installed (it is in the dev extra)")
    return server


@pytest.fixture(scope="module")
def gateway(
    database_env: tuple[dict[str, str], Path], gateway_server: str
) -> Iterator[GatewayProcess]:
    """A running gateway shared by a test module (tests use their own queue names)."""
    env, var = database_env
    name = "gw" if gateway_server == "daphne" else f"gw-{gateway_server}"
    process = GatewayProcess(env, var, name=name, server=gateway_server)
    process.start()
    yield process
    process.stop()


@pytest.fixture
def own_gateway(
    database_env: tuple[dict[str, str], Path], gateway_server: str
) -> Iterator[GatewayProcess]:
    """A gateway of the test's own, for tests that kill or restart it."""
    env, var = database_env
    process = GatewayProcess(env, var, name="own", server=gateway_server)
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def admin_token(gateway: GatewayProcess) -> str:
    return gateway.issue_token("admin", name="admin")


@pytest.fixture(scope="module")
def postgres_env() -> Iterator[tuple[dict[str, str], Path]]:
    """A migrated PostgreSQL database only (for what SQLite cannot do)."""
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix="leasecast-pg-"))
    with postgres_database(var) as env:
        yield env, var
