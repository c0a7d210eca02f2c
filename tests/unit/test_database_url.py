"""DATABASE_URL parsing: libpq's multi-host URLs reach psycopg whole (issue 27, failover).

A PostgreSQL primary and its standby are named in one URL,
``postgresql://user@primary:5432,standby:5432/db?target_session_attrs=read-write``,
so every new connection finds the server that accepts writes. dj-database-url
refused that URL (its port is not one number), so a gateway could not be
pointed at a primary and a standby at all.
"""

from __future__ import annotations

import pytest

from gateway.site.database_url import NETWORK_DEFAULTS, parse_database_url


def test_a_multi_host_url_keeps_every_host_and_port_in_order() -> None:
    url = (
        "postgresql://lc:s%40cret@10.0.0.1:5432,10.0.0.2:5433/leasecast"
        "?target_session_attrs=read-write&connect_timeout=2"
    )
    config = parse_database_url(url)
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["HOST"], config["PORT"]) == ("10.0.0.1,10.0.0.2", "5432,5433")
    assert (config["USER"], config["PASSWORD"], config["NAME"]) == ("lc", "s@cret", "leasecast")
    assert config["OPTIONS"] == {
        **NETWORK_DEFAULTS,
        "target_session_attrs": "read-write",
        "connect_timeout": 2,
    }
    assert config["CONN_MAX_AGE"] == 0


def test_hosts_without_ports_and_ipv6_hosts() -> None:
    assert parse_database_url("postgres://u@a,b/db")["HOST"] == "a,b"
    assert parse_database_url("postgres://u@a,b/db")["PORT"] == ""
    config = parse_database_url("postgresql://u@[::1]:5432,b/db")
    assert (config["HOST"], config["PORT"]) == ("::1,b", "5432,5432")


def test_a_single_host_url_is_parsed_as_before() -> None:
    config = parse_database_url("postgresql://u:p@db.example:6543/x?sslmode=require")
    assert (config["HOST"], config["PORT"], config["NAME"]) == ("db.example", 6543, "x")
    assert config["OPTIONS"] == {**NETWORK_DEFAULTS, "sslmode": "require"}


def test_a_postgresql_url_bounds_waits_on_a_silent_host_unless_it_says_otherwise() -> None:
    """A partition (tests/cluster/test_partitions.py) must not hold a connection for minutes:
    libpq's connect timeout, TCP user timeout and keepalives are set, the URL's own win."""
    config = parse_database_url("postgresql://u@db/x?tcp_user_timeout=20000&keepalives_idle=9")
    assert config["OPTIONS"]["tcp_user_timeout"] == 20000
    assert config["OPTIONS"]["keepalives_idle"] == 9
    assert config["OPTIONS"]["connect_timeout"] == NETWORK_DEFAULTS["connect_timeout"]
    assert 0 < NETWORK_DEFAULTS["tcp_user_timeout"] <= 10_000
    assert NETWORK_DEFAULTS["keepalives"] == 1
    # Not for SQLite, which has no network.
    assert "tcp_user_timeout" not in parse_database_url("sqlite:////tmp/x.db").get("OPTIONS", {})


def test_a_connection_to_a_multi_host_url_tries_the_hosts_in_order() -> None:
    """psycopg (libpq's rules) gets the lists: the first host refuses, the second is used."""
    import psycopg

    from tests.support.databases import PG_ADMIN_URL, postgres_unavailable

    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    # Port 1 on loopback refuses at once; the real server is the second host.
    admin = parse_database_url(PG_ADMIN_URL)
    config = parse_database_url(
        f"postgresql://{admin['USER']}@127.0.0.1:1,{admin['HOST']}:{admin['PORT']}/"
        f"{admin['NAME']}?target_session_attrs=read-write&connect_timeout=3"
    )
    with psycopg.connect(
        host=config["HOST"],
        port=config["PORT"],
        user=config["USER"],
        dbname=config["NAME"],
        **config["OPTIONS"],
    ) as conn:
        assert conn.info.port == int(admin["PORT"])


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@a:5432,b:notaport/db",
        "postgresql://u@a:5432,,b/db",
        "postgresql://u@a:70000,b/db",
        "mysql://u@a,b/db",
    ],
)
def test_a_bad_host_list_is_refused_with_a_clear_error(url: str) -> None:
    with pytest.raises(ValueError, match="DATABASE_URL"):
        parse_database_url(url)
