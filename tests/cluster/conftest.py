"""Deployments on separate hosts (network namespaces): skipped, with the reason, where
namespaces cannot be made (not root, no ``ip``) or a server is missing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.deploy import Deployment, deployment
from tests.cluster.netns import netns_unavailable
from tests.cluster.services import servers_unavailable


def _skip_unless_possible() -> None:
    reason = netns_unavailable() or servers_unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def hosts() -> Iterator[Deployment]:
    """Two gateway hosts behind haproxy, PostgreSQL and Redis on hosts of their own."""
    _skip_unless_possible()
    with deployment() as d:
        yield d


@pytest.fixture(scope="module")
def module_hosts() -> Iterator[Deployment]:
    """As ``hosts``, one deployment for every test of a module (each test uses its own
    queues and topics, and leaves the hosts as it found them)."""
    _skip_unless_possible()
    with deployment() as d:
        yield d


@pytest.fixture
def replicated() -> Iterator[Deployment]:
    """As ``hosts``, with a synchronous standby of the database on a host of its own."""
    _skip_unless_possible()
    with deployment(standby=True) as d:
        yield d


@pytest.fixture
def sentinel() -> Iterator[Deployment]:
    """As ``hosts``, with a replica of Redis and three Sentinels the gateways follow."""
    _skip_unless_possible()
    with deployment(sentinel=True) as d:
        yield d
