"""The standalone service's front door: ``/`` and the admin's "View site" lead to the dashboard.

Against a real gateway process: ``/`` was a bare 404, and the admin's
"View site" link pointed there.
"""

from __future__ import annotations

import re

from tests.support.gateways import GatewayProcess
from tests.support.sessions import Client

PASSWORD = "root page password"


def test_the_root_sends_operators_to_the_dashboard(gateway: GatewayProcess) -> None:
    reply = Client(gateway.http).request("GET", "/")
    assert reply.status == 302, reply.text[:300]
    assert reply.headers["Location"] == "/dashboard/"
    # Not logged in, the dashboard itself sends the visitor to log in.
    login = Client(gateway.http).request("GET", "/dashboard/")
    assert login.status == 302 and login.headers["Location"].startswith("/admin/login/")


def test_the_admins_view_site_link_is_the_dashboard(gateway: GatewayProcess) -> None:
    gateway.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User;"
        f"User.objects.create_superuser('rootcheck', 'r@example.com', {PASSWORD!r})",
    )
    staff = Client(gateway.http)
    staff.login("rootcheck", PASSWORD)
    page = staff.request("GET", "/admin/")
    assert page.status == 200
    link = re.search(r'<a href="([^"]*)">View site</a>', page.text)
    assert link is not None, page.text[:2000]
    assert link.group(1) == "/dashboard/"
