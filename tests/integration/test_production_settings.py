"""The standalone service's production settings, hardened from the environment.

``GATEWAY_ENV=production`` behind a TLS proxy (``GATEWAY_PROXY_SSL_HEADER``)
passes ``manage.py check --deploy`` with no warning; a real daphne process
behind what such a proxy sends (``X-Forwarded-Proto: https`` and the public
``Host``) lets a staff user log in to the admin and use the dashboard's API
actions, with ``Secure`` cookies and HSTS; weak passwords are refused and
repeated failed logins are throttled.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.databases import ROOT, sqlite_database
from tests.support.gateways import GatewayProcess

HOST = "gw.example.com"
ORIGIN = f"https://{HOST}"
STAFF = "ops"
PASSWORD = "correct horse battery staple 42"


def production_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` (a migrated database) as a production deployment behind a TLS proxy."""
    return {
        **env,
        "GATEWAY_ENV": "production",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "GATEWAY_ALLOWED_HOSTS": f"{HOST},127.0.0.1",
        "GATEWAY_PROXY_SSL_HEADER": "X-Forwarded-Proto",
    }


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def database() -> Iterator[dict[str, str]]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-production-"))
    with sqlite_database(var) as env:
        yield env


@pytest.fixture(scope="module")
def gateway(database: dict[str, str]) -> Iterator[GatewayProcess]:
    """A production gateway with a staff user, served by daphne."""
    env = production_env(database)
    var = Path(env["GATEWAY_VAR_DIR"])
    with ExitStack() as stack:
        process = GatewayProcess(env, var, name="production")
        done = manage(
            {**env, "DJANGO_SUPERUSER_PASSWORD": PASSWORD},
            "createsuperuser",
            "--noinput",
            "--username",
            STAFF,
            "--email",
            "ops@example.com",
        )
        assert done.returncode == 0, done.stderr
        process.start()
        stack.callback(process.stop)
        yield process


def test_check_deploy_finds_nothing_behind_a_tls_proxy(database: dict[str, str]) -> None:
    done = manage(production_env(database), "check", "--deploy", "--fail-level", "WARNING")
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout, done.stdout


def test_a_bad_proxy_header_is_refused_by_name(database: dict[str, str]) -> None:
    env = {**production_env(database), "GATEWAY_PROXY_SSL_HEADER": "X Forwarded: Proto"}
    done = manage(env, "check")
    assert done.returncode != 0
    assert "GATEWAY_PROXY_SSL_HEADER" in done.stderr


def test_production_refuses_a_weak_password(database: dict[str, str]) -> None:
    # What the admin's password forms and createsuperuser (interactive) run.
    check = "from django.contrib.auth.password_validation import validate_password as v; v({!r})"
    done = manage(production_env(database), "shell", "-c", check.format("password"))
    assert done.returncode != 0
    assert "too common" in done.stderr, done.stderr
    assert manage(production_env(database), "shell", "-c", check.format(PASSWORD)).returncode == 0


class Browser:
    """Requests as a TLS proxy forwards a browser's: public Host, X-Forwarded-Proto."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.port = gateway.port
        self.cookies: dict[str, str] = {}

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        https: bool = True,
    ) -> tuple[int, http.client.HTTPMessage, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        sent = {"Host": HOST, **(headers or {})}
        if https:
            sent["X-Forwarded-Proto"] = "https"
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        for cookie in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = cookie.partition("=")
            self.cookies[name] = rest.split(";", 1)[0]
        return response.status, response.headers, text

    def log_in(self, password: str) -> tuple[int, http.client.HTTPMessage]:
        status, _, page = self.request("GET", "/admin/login/")
        assert status == 200
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert csrf is not None
        form = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": csrf[1], "username": STAFF, "password": password}
        )
        status, headers, _ = self.request(
            "POST",
            "/admin/login/?next=/admin/",
            form.encode(),
            {
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": ORIGIN,
                "Referer": f"{ORIGIN}/admin/login/",
            },
        )
        return status, headers


def secure_cookie(headers: http.client.HTTPMessage, name: str) -> bool:
    for cookie in headers.get_all("Set-Cookie") or []:
        if cookie.startswith(f"{name}="):
            return "secure" in cookie.lower()
    raise AssertionError(f"no {name} cookie set")


def test_staff_log_in_and_act_through_a_tls_proxy(gateway: GatewayProcess) -> None:
    browser = Browser(gateway)
    status, headers = browser.log_in(PASSWORD)
    assert (status, headers["Location"]) == (302, "/admin/"), gateway.log_text()[-2000:]
    assert secure_cookie(headers, "sessionid")
    status, headers, _ = browser.request("GET", "/dashboard/")
    assert status == 200
    assert "max-age=" in headers["Strict-Transport-Security"]
    # Session-authenticated changes, CSRF-checked as the dashboard's actions are.
    changes = {
        "Content-Type": "application/json",
        "X-CSRFToken": browser.cookies["csrftoken"],
        "Origin": ORIGIN,
    }
    path = "/api/queues/tls.orders/messages"
    status, _, body = browser.request("POST", path, b'{"messages": [{"body": 1}]}', changes)
    assert status == 200, body
    status, _, body = browser.request("POST", "/api/queues/tls.orders/purge", b"{}", changes)
    assert status == 200, body
    assert json.loads(body)["purged"] == 1


def test_pages_over_plain_http_go_to_https_and_programs_are_not_redirected(
    gateway: GatewayProcess,
) -> None:
    browser = Browser(gateway)
    status, headers, _ = browser.request("GET", "/admin/login/", https=False)
    assert (status, headers["Location"]) == (301, f"{ORIGIN}/admin/login/")
    # Workers, producers and probes inside the network call these over plain HTTP.
    assert browser.request("GET", "/healthz", https=False)[0] == 200
    assert browser.request("GET", "/api/stats", https=False)[0] == 401


def test_repeated_failed_logins_are_throttled(gateway: GatewayProcess) -> None:
    browser = Browser(gateway)
    for _ in range(5):
        status, _ = browser.log_in("not the password")
        assert status == 200  # the form again, with its error
    # Now even the right password is refused for a while.
    status, _ = browser.log_in(PASSWORD)
    assert status == 200
    assert Browser(gateway).log_in(PASSWORD)[0] == 200
