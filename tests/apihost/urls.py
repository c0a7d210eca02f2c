"""The project's routes: Leasecast's at the root, and an API of its own under /api/v1/."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import include, path


def ping(request: HttpRequest) -> HttpResponse:
    """A route of the project's own under /api/."""
    return HttpResponse("pong", content_type="text/plain")


urlpatterns = [
    path("", include("gateway.api_urls")),
    path("api/v1/ping", ping),
]
