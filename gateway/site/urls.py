"""HTTP routes of the standalone service: Leasecast's routes and the Django admin.

The routes themselves are in ``gateway.api_urls``, which a Django project
that installs Leasecast includes beside its own admin.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

from consumers import http
from gateway.site import api_urls

# The admin's "View site" link: the dashboard, not the bare root.
admin.site.site_url = "/dashboard/"

urlpatterns = [
    *api_urls.urlpatterns,
    # Operators arrive at the dashboard (it sends everyone else to log in).
    path("", RedirectView.as_view(pattern_name="dashboard"), name="home"),
    path("admin/", admin.site.urls),
    # All of /api/ is the gateway's here: an unknown URL is a JSON 404 too.
    path("api/", http.not_found),  # type: ignore[arg-type]
    path("api/<path:rest>", http.not_found),  # type: ignore[arg-type]
]
