"""In a Django project that includes ``gateway.api_urls`` beside its own routes,
Leasecast's API prefixes answer JSON for unknown URLs (before, Django's HTML
404), and the rest of /api/ stays the project's (protocol 1.2: every answer
under /api/ is JSON)."""

from __future__ import annotations

import json

from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import include, path


def host_view(request: HttpRequest) -> HttpResponse:
    """A route of the host project's own under /api/."""
    return HttpResponse("pong", content_type="text/plain")


# This module is the host project's URLconf in these tests.
urlpatterns = [
    path("", include("gateway.api_urls")),
    path("api/v1/ping", host_view),
]


@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"], DEBUG=False)
def test_unknown_urls_under_leasecast_prefixes_are_json() -> None:
    """Authentication first, as on every endpoint: a stranger is told 401, in JSON
    (an authenticated caller gets 404 ``not_found``: tests/integration/test_bad_input.py)."""
    client = Client()
    for url in (
        "/api/queues/q/messages/1/2/3",
        "/api/queues/q/nothing",
        "/api/topics/t/nothing",
        "/api/transactions/t",
        "/api/stats/more",
    ):
        response = client.get(url)
        assert response.status_code == 401, url
        assert response["Content-Type"] == "application/json", url
        assert json.loads(response.content)["error"] == "unauthorized", url


@override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"], DEBUG=False)
def test_the_rest_of_api_stays_the_host_projects() -> None:
    client = Client()
    response = client.get("/api/v1/ping")
    assert (response.status_code, response.content) == (200, b"pong")
    # Not Leasecast's: the project's own 404, whatever it is.
    response = client.get("/api/v1/nothing")
    assert response.status_code == 404
    assert response["Content-Type"] != "application/json"
