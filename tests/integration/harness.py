"""The old path of the integration tests' helpers, kept for bench/ and older imports.

They live in :mod:`tests.support` now (:mod:`tests.support.gateways` for the
processes, :mod:`tests.support.clients` for the clients); tests import them
from there.
"""

from __future__ import annotations

from tests.support.clients import Socket, ahttp, http, unique
from tests.support.gateways import (
    DAPHNE,
    SERVERS,
    UVICORN,
    Balancer,
    GatewayProcess,
    both_servers,
    default_server,
    free_port,
    gateways_on_redis,
    haproxy_path,
    haproxy_unavailable,
)

__all__ = [
    "DAPHNE",
    "SERVERS",
    "UVICORN",
    "Balancer",
    "GatewayProcess",
    "Socket",
    "ahttp",
    "both_servers",
    "default_server",
    "free_port",
    "gateways_on_redis",
    "haproxy_path",
    "haproxy_unavailable",
    "http",
    "unique",
]
