"""Leasecast's HTTP API inside a Django project with routes of its own under
/api/ and Django's default body limit (tests/apihost), served by real daphne:
Leasecast's answers are JSON, errors included (protocol 1.2), and the rest of
/api/ stays the project's."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import http, unique
from tests.support.gateways import GatewayProcess


@pytest.fixture(scope="module")
def host(database_env: tuple[dict[str, str], Path]) -> Iterator[GatewayProcess]:
    env, var = database_env
    settings = {**env, "DJANGO_SETTINGS_MODULE": "tests.apihost.settings"}
    process = GatewayProcess(settings, var, name="apihost")
    process.start()
    yield process
    process.stop()


def test_leasecast_answers_json_in_a_host_project(host: GatewayProcess) -> None:
    token = host.issue_token("admin", name="admin")
    q = unique()
    for method, path, status, code in (
        ("GET", f"/api/queues/{q}/nothing", 404, "not_found"),
        ("GET", f"/api/queues/{q}/messages/1/2", 404, "not_found"),
        ("POST", "/api/transactions/t/partitions", 404, "not_found"),
        ("DELETE", f"/api/queues/{q}/purge", 405, "invalid"),
        ("PATCH", f"/api/queues/{q}/messages", 405, "invalid"),
    ):
        got_status, got = http(method, host.http + path, token)
        assert isinstance(got, dict), (method, path, got)
        assert (got_status, got["error"]) == (status, code), (method, path, got)
    # Over Django's own limit (2.5 MB here): 413 in JSON, not Django's HTML 400
    # with a traceback in the log.
    big = b'{"messages": [{"body": "' + b"x" * (3 * 1024 * 1024) + b'"}]}'
    status, got = http("POST", f"{host.http}/api/queues/{q}/messages", token, raw=big)
    assert isinstance(got, dict) and (status, got["error"]) == (413, "too_large"), (status, got)
    assert "RequestDataTooBig" not in host.log_text()
    assert http("GET", f"{host.http}/api/queues/{q}", token)[0] == 404  # nothing enqueued


def test_the_rest_of_api_stays_the_projects(host: GatewayProcess) -> None:
    with urllib.request.urlopen(f"{host.http}/api/v1/ping", timeout=30) as response:
        assert (response.status, response.read()) == (200, b"pong")
    status, got = http("GET", f"{host.http}/api/v1/nothing")
    assert status == 404 and not isinstance(got, dict), got  # the project's own 404
