"""Staff sessions against a live gateway: logging in, cookies, the admin's actions and log.

``Client`` is a browser-like HTTP client that keeps cookies and returns
redirects (for checking who is sent where); ``StaffSession`` follows
redirects and drives the admin's changelist actions. Sockets opened as a
given caller (token, session cookie, ``Origin``) and what a socket said
before it closed are here too.
"""

from __future__ import annotations

import html
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from http.cookiejar import CookieJar
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.support.clients import Socket
from tests.support.gateways import GatewayProcess

#: The password of every user the tests create.
PASSWORD = "correct horse battery"
LOGIN_PATH = "/admin/login/"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


class Client:
    """Plain HTTP with a cookie jar, as a browser would hold it; redirects are returned."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )

    def request(
        self,
        method: str,
        path: str,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        if data is None and method not in ("GET", "HEAD", "DELETE"):
            data = b""
        request = urllib.request.Request(self.base + path, data=data, method=method)
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with self.opener.open(request, timeout=60) as response:
                return Reply(response.status, dict(response.headers), response.read().decode())
        except urllib.error.HTTPError as err:
            return Reply(err.code, dict(err.headers), err.read().decode(errors="replace"))

    def cookie(self, name: str) -> str | None:
        return next((c.value for c in self.jar if c.name == name), None)

    def cookie_header(self) -> str:
        return "; ".join(f"{c.name}={c.value}" for c in self.jar)

    def login(self, username: str, password: str = PASSWORD) -> None:
        self.request("GET", LOGIN_PATH)
        form = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": self.cookie("csrftoken") or "",
                "username": username,
                "password": password,
                "next": "/admin/",
            }
        ).encode()
        reply = self.request(
            "POST",
            LOGIN_PATH,
            form,
            {"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert reply.status == 302 and reply.headers["Location"] == "/admin/", reply.text[:500]
        assert self.cookie("sessionid")


def own_origin(gw: GatewayProcess) -> str:
    return f"http://127.0.0.1:{gw.port}"


async def open_socket(
    url: str,
    *,
    token: str | None = None,
    cookie: str | None = None,
    origin: str | None = None,
    **kwargs: Any,
) -> Socket:
    """A socket as a given caller: a bearer token, a session cookie, an Origin."""
    headers = {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if cookie:
        headers["Cookie"] = cookie
    if origin:
        headers["Origin"] = origin
    conn = await connect(url, additional_headers=headers, max_size=None, **kwargs)
    return Socket(conn)


async def socket_outcome(s: Socket) -> str:
    """``ok`` if the socket is open and answering, else what it said before closing."""
    try:
        reply = await s.request({"op": "probe-unknown"})
    except (ConnectionError, ConnectionClosed):
        await s.reader
        frames = []
        while not s.frames.empty():
            frames.append(s.frames.get_nowait())
        errors = [f for f in frames if f.get("op") == "error"]
        code = errors[0]["code"] if errors else "no error frame"
        return f"{code} {s.conn.close_code}"
    await s.close()
    return "ok" if reply.get("code") == "unknown_op" else f"unexpected {reply}"


class StaffSession:
    """A logged-in staff user's session on a live gateway: cookies, CSRF, plain HTTP.

    Admin actions are the POSTs the changelist's action form sends, so they run
    the admin's own code in the gateway process, against its database.
    """

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=60) as response:
            text: str = response.read().decode()
            return text

    def post(self, path: str, fields: list[tuple[str, str]]) -> str:
        csrf = next(c.value for c in self.jar if c.name == "csrftoken")
        data = urllib.parse.urlencode([("csrfmiddlewaretoken", csrf), *fields]).encode()
        request = urllib.request.Request(self.base + path, data=data, method="POST")
        with self.opener.open(request, timeout=60) as response:  # follows the redirect
            text: str = response.read().decode()
            return text

    def login(self, username: str, password: str) -> None:
        self.get("/admin/login/")
        page = self.post(
            "/admin/login/?next=/admin/",
            [("username", username), ("password", password), ("next", "/admin/")],
        )
        assert "Site administration" in page, page[:2000]

    def action(self, model: str, action: str, ids: list[str], confirm: bool = False) -> str:
        """Select rows ``ids`` of ``model``'s changelist and run ``action`` on them."""
        fields = [("action", action), ("index", "0"), ("select_across", "0")]
        fields += [("_selected_action", i) for i in ids]
        if confirm:  # the second step of actions that ask first (delete selected)
            fields.append(("post", "yes"))
        return self.post(f"/admin/gateway/{model}/", fields)

    def pk(self, model: str, name: str) -> str:
        """The primary key of the row named ``name``, from the changelist's link to it."""
        search = f"?q={urllib.parse.quote(name)}" if model == "queue" else ""  # queues have many
        page = self.get(f"/admin/gateway/{model}/{search}")
        found = re.search(
            rf'/admin/gateway/{model}/(\d+)/change/[^"]*">{re.escape(name)}</a>', page
        )
        assert found, f"no {model} {name!r} in the changelist"
        return found.group(1)


def notices(page: str) -> list[str]:
    """The admin's messages to the user (the ``messagelist``) on a page (first letter capital)."""
    return [html.unescape(m) for m in re.findall(r'<li class="\w+">([^<]*)</li>', page)]


def admin_log(gateway: GatewayProcess) -> list[dict[str, Any]]:
    """Django's admin log (LogEntry), as the gateway's database holds it."""
    out = gateway.manage(
        "shell",
        "-c",
        "import json; from django.contrib.admin.models import LogEntry;"
        "print(json.dumps([{'user': e.user.username, 'model': e.content_type and "
        "e.content_type.model, 'object_id': e.object_id, 'flag': e.action_flag, "
        "'message': e.change_message} for e in LogEntry.objects.all()]))",
    )
    entries: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    return entries


def logged(entries: list[dict[str, Any]], model: str, object_id: str) -> list[dict[str, Any]]:
    return [e for e in entries if e["model"] == model and e["object_id"] == object_id]
