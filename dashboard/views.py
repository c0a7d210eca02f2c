"""The dashboard page (staff only; everyone else is sent to log in).

A staff user also needs the permission ``gateway.view_queue`` (or to be a
superuser), as the dashboard's socket and the API do (protocol 1.2: staff is
not enough); without it the page is 403.
"""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import ensure_csrf_cookie

from gateway.access.auth import principal_for_user

#: Defence in depth behind the page's own rule (every server value is inserted
#: as text, never as HTML): no inline script, no event-handler attributes, no
#: script from elsewhere, so even a value that slipped in as markup cannot run.
#: Inline style stays allowed for the fill bars' widths.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


def _answers(path: str, route_end: str) -> bool:
    """Whether this site routes ``path`` to an endpoint of its own (not the API's JSON 404).

    The queue's cancel endpoint is built apart from the dashboard: until the
    site routes it, the page says its cancel button is unavailable.
    """
    try:
        match = resolve(path)
    except Resolver404:
        return False
    return str(match.route).endswith(route_end)


@staff_member_required
@ensure_csrf_cookie  # the page's purge and redrive buttons POST with it
def index(request: HttpRequest) -> HttpResponse:
    """The live page; its data comes over ``/ws/dashboard/``.

    The page shows only the controls its user may use (the API refuses the
    others anyway): acting on queues, messages and tasks needs
    ``gateway.change_queue``, publishing ``gateway.change_topic``.
    """
    principal = principal_for_user(request.user)
    if principal is None or not principal.allows("view_queue"):
        raise PermissionDenied("the dashboard needs the permission gateway.view_queue")
    context = {
        "can_change": principal.allows("change_queue"),
        "can_publish": principal.allows("publish", "*") or principal.allows("change_topic"),
        "cancel_available": _answers("/api/queues/q/messages/1/cancel", "/cancel"),
    }
    response = render(request, "dashboard/index.html", context)
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response
