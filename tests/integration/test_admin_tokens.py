"""The Django admin's token and name handling (issue 22.12), against a live gateway.

- A token added in the admin is shown once, in the answer to the form: not
  in a message, which Django keeps in the ``messages`` cookie (signed, not
  encrypted) or the session until the next page; the answer is not cached.
- The admin refuses queue and topic names the protocol cannot address.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import http
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.sessions import PASSWORD, Client


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    var: Path = tmp_path_factory.mktemp("admin-tokens")
    with sqlite_database(var) as env:
        process = GatewayProcess(env, var, name="admin-tokens")
        process.start()
        process.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser('root', 'r@example.com', {PASSWORD!r})",
        )
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture
def staff(site: GatewayProcess) -> Client:
    client = Client(site.http)
    client.login("root")
    return client


def _post_form(
    client: Client, path: str, fields: dict[str, str]
) -> tuple[int, str, dict[str, str]]:
    client.request("GET", path)
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": client.cookie("csrftoken") or "", **fields}
    ).encode()
    reply = client.request(
        "POST", path, form, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    return reply.status, reply.text, reply.headers


def test_a_new_tokens_secret_is_shown_once_and_never_put_in_a_cookie(
    site: GatewayProcess, staff: Client
) -> None:
    status, page, headers = _post_form(
        staff,
        "/admin/gateway/token/add/",
        {"name": "from-the-form", "scopes_text": "admin", "revoked_at_0": "", "revoked_at_1": ""},
    )
    assert status == 200, page[:2000]
    found = re.search(r"Token for from-the-form: (lc_[\w-]+)", page)
    assert found, page[:3000]
    secret = found.group(1)
    assert "no-store" in headers.get("Cache-Control", ""), headers
    # Nowhere in what the browser keeps: no messages cookie, no cookie value holding it.
    assert staff.cookie("messages") is None
    assert all(secret not in (cookie.value or "") for cookie in staff.jar)
    assert "Set-Cookie" not in headers or "messages=" not in headers["Set-Cookie"]
    # Nor on the next page (a message would have shown it there).
    listing = staff.request("GET", "/admin/gateway/token/")
    assert listing.status == 200 and secret not in listing.text
    assert "from-the-form" in listing.text
    # It is a real token.
    status_api, _ = http("GET", f"{site.http}/api/stats", secret)
    assert status_api == 200


@pytest.mark.parametrize("name", ["has space", "a/b", "émoji", "x" * 201, "semi;colon"])
@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_the_admin_refuses_names_the_protocol_cannot_use(
    site: GatewayProcess, staff: Client, kind: str, name: str
) -> None:
    fields = {"name": name}
    if kind == "queue":
        fields.update(
            visibility_timeout="30",
            max_deliveries="5",
            dedup_window="300",
            max_length="0",
            overflow="drop_newest",
        )
    else:
        fields.update(history_size="0", history_ttl="300")
    status, page, _ = _post_form(staff, f"/admin/gateway/{kind}/add/", fields)
    assert status == 200 and "errorlist" in page, page[:2000]
    assert f"A {kind} name is 1-200 characters" in page
    model = kind.capitalize()
    stored = site.manage(
        "shell",
        "-c",
        f"from gateway.models import {model}; print({model}.objects.filter(name={name!r}).count())",
    )
    assert stored.strip().splitlines()[-1] == "0", stored


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_the_admin_takes_a_good_name(site: GatewayProcess, staff: Client, kind: str) -> None:
    fields = {"name": f"good.{kind}_name-1"}
    if kind == "queue":
        fields.update(
            visibility_timeout="30",
            max_deliveries="5",
            dedup_window="300",
            max_length="0",
            overflow="drop_newest",
        )
    else:
        fields.update(history_size="0", history_ttl="300")
    status, page, _ = _post_form(staff, f"/admin/gateway/{kind}/add/", fields)
    assert status == 302, page[:2000]
