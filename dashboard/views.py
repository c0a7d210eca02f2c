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


@staff_member_required
@ensure_csrf_cookie  # the page's purge and redrive buttons POST with it
def index(request: HttpRequest) -> HttpResponse:
    """The live page; its data comes over ``/ws/dashboard/``."""
    principal = principal_for_user(request.user)
    if principal is None or not principal.allows("view_queue"):
        raise PermissionDenied("the dashboard needs the permission gateway.view_queue")
    response = render(request, "dashboard/index.html")
    response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response
