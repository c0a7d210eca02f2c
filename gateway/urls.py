"""HTTP routes of the standalone service: Leasecast's routes and the Django admin.

The routes themselves are in ``gateway.api_urls``, which a Django project
that installs Leasecast includes beside its own admin.
"""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from gateway import api_urls

urlpatterns = [
    *api_urls.urlpatterns,
    path("admin/", admin.site.urls),
]
