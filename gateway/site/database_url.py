"""``DATABASE_URL`` to Django's ``DATABASES`` entry, libpq's multi-host form included.

A PostgreSQL primary and its standby are named in one URL, as libpq reads it::

    postgresql://USER@primary:5432,standby:5432/NAME?target_session_attrs=read-write

Every new connection then tries the hosts in order and keeps the first that
accepts writes, so after a failover the gateway's next connection finds the
promoted standby by itself (docs/operations.md, "A primary and a standby").
dj-database-url parses the rest of the URL, but refuses such a netloc (its
port is not one number); the host and port lists are taken out before it
parses and given back to Django as ``HOST`` and ``PORT``, which Django's
PostgreSQL backend hands to psycopg, and psycopg to libpq's rules, unchanged.

A PostgreSQL URL also gets bounds on how long a connection may wait on a
database host that has stopped answering (:data:`NETWORK_DEFAULTS`), unless
it sets them itself. Without them, a network partition between a gateway
and its database (packets dropped, nothing refused) held the store's one
connection for as long as the kernel kept retransmitting (about 15 minutes),
or for ever if it was waiting for an answer, and every operation of the
process waited with it; with them the connection fails within seconds and
operations are answered ``unavailable`` until the database is reachable
again (tests/cluster/test_partitions.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import dj_database_url

__all__ = ["NETWORK_DEFAULTS", "parse_database_url"]

_POSTGRES_SCHEMES = ("postgres", "postgresql", "pgsql")
#: Django backends that connect through libpq (psycopg).
_POSTGRES_ENGINES = ("django.db.backends.postgresql", "django.contrib.gis.db.backends.postgis")
#: libpq's port when a host of a list names none but another one does.
_DEFAULT_PORT = "5432"
#: Stands for the host list while dj-database-url parses the rest.
_PLACEHOLDER = "multi-host.invalid"
#: libpq connection parameters a PostgreSQL URL gets unless it names them:
#: how long a database host that does not answer may hold a connection.
#: ``connect_timeout`` bounds each host's attempt at a new connection (libpq
#: waits for ever by default); ``tcp_user_timeout`` (milliseconds) drops a
#: connection whose sent data stays unacknowledged that long; the keepalives
#: (a probe after 2 s of silence, then every second, given up on with
#: ``tcp_user_timeout``) find a connection whose peer vanished while it
#: waited for an answer. A busy server still acknowledges packets and
#: keepalive probes, so a long query is not cut short by them.
NETWORK_DEFAULTS: dict[str, int] = {
    "connect_timeout": 3,
    "tcp_user_timeout": 5000,
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
}


def parse_database_url(url: str, conn_max_age: int = 0) -> dict[str, Any]:
    """Django's ``DATABASES["default"]`` for ``url``.

    A URL with one host is parsed by dj-database-url as it always was. One
    whose host part is a comma-separated list (PostgreSQL only) gets ``HOST``
    ``"h1,h2"`` and ``PORT`` ``"p1,p2"`` (or ``""`` when no host names a port),
    its query parameters (``target_session_attrs``, ``connect_timeout``...)
    in ``OPTIONS`` as usual. A PostgreSQL URL's ``OPTIONS`` also hold each
    of :data:`NETWORK_DEFAULTS` that the URL does not set.

    Raises:
        ValueError: the host list is malformed, or the scheme is not PostgreSQL's;
            the message names ``DATABASE_URL`` and never the password.
    """
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist:
        config = dict(dj_database_url.parse(url, conn_max_age=conn_max_age))
        if config.get("ENGINE") in _POSTGRES_ENGINES:
            _bound_network_waits(config)
        return config
    if parts.scheme not in _POSTGRES_SCHEMES:
        raise ValueError(
            f"DATABASE_URL: only PostgreSQL URLs may name several hosts, not {parts.scheme}://"
        )
    pairs = [_host_and_port(item) for item in hostlist.split(",")]
    config = dict(
        dj_database_url.parse(
            urlunsplit(parts._replace(netloc=f"{userinfo}{at}{_PLACEHOLDER}")),
            conn_max_age=conn_max_age,
        )
    )
    config["HOST"] = ",".join(host for host, _ in pairs)
    named = [port for _, port in pairs]
    # libpq wants one port for all hosts or one per host.
    config["PORT"] = ",".join(port or _DEFAULT_PORT for port in named) if any(named) else ""
    _bound_network_waits(config)
    return config


def _bound_network_waits(config: dict[str, Any]) -> None:
    """Add each of :data:`NETWORK_DEFAULTS` the URL did not set to ``config["OPTIONS"]``."""
    options = config.setdefault("OPTIONS", {})
    for name, value in NETWORK_DEFAULTS.items():
        options.setdefault(name, value)


def _host_and_port(item: str) -> tuple[str, str]:
    """``host[:port]`` or ``[v6]:port`` of a host list, checked."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
        if rest and not rest.startswith(":"):
            host = ""
    else:
        host, _, port = item.partition(":")
    host = unquote(host)
    if not host:
        raise ValueError(f"DATABASE_URL: an empty host in the host list ({item!r})")
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"DATABASE_URL: {port!r} is not a port (host {host!r})")
    return host, port
