"""The work queue 1.1 tests' deployments: one gateway per backend for the whole package.

Every module here speaks to the same two gateways (SQLite and PostgreSQL),
each started once on first use and stopped, its database dropped, at the end
of the session (or of the parallel worker that ran the package: make test
keeps the package on one worker). Their start-up was most of these modules'
run time when each started its own. Tests use queue names of their own
(``unique``), so they do not see each other's messages.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.integration.queue11.wq11 import BLOCK_WAIT, NARROW, Deployment
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess


def _deploy(kind: str) -> Iterator[Deployment]:
    """A running 1.1 gateway on ``kind`` ("sqlite" or "postgres"), with its tokens."""
    if kind == "postgres":
        reason = postgres_unavailable()
        if reason:
            pytest.skip(reason)
    with ExitStack() as stack:
        var = Path(tempfile.mkdtemp(prefix=f"leasecast-v11-{kind}-"))
        database = sqlite_database(var) if kind == "sqlite" else postgres_database(var)
        env = stack.enter_context(database)
        gw = GatewayProcess({**env, "GATEWAY_BLOCK_WAIT": str(BLOCK_WAIT)}, var, name=f"v11{kind}")
        stack.callback(gw.stop)
        gw.start()
        yield Deployment(
            gateway=gw,
            env=gw.env,
            var=var,
            admin=gw.issue_token("admin", name="admin"),
            consumer=gw.issue_token(f"consume:{NARROW}*", f"enqueue:{NARROW}*", name="consumer"),
            producer=gw.issue_token(f"enqueue:{NARROW}*", name="producer"),
        )


@pytest.fixture(scope="session")
def v11_sqlite() -> Iterator[Deployment]:
    """The package's gateway on SQLite."""
    yield from _deploy("sqlite")


@pytest.fixture(scope="session")
def v11_postgres() -> Iterator[Deployment]:
    """The package's gateway on PostgreSQL (skipped, saying why, when it does not answer)."""
    yield from _deploy("postgres")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def v11(request: pytest.FixtureRequest) -> Deployment:
    """The shared 1.1 gateway of each backend: every test of a module runs on both."""
    found: Deployment = request.getfixturevalue(f"v11_{request.param}")
    return found


@pytest.fixture(scope="module")
def gateway(v11: Deployment) -> GatewayProcess:
    return v11.gateway


@pytest.fixture(scope="module")
def admin_token(v11: Deployment) -> str:
    return v11.admin
