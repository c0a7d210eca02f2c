"""The public path of the HTTP API's URLs for a host project: ``gateway.api_urls``.

The code is in :mod:`gateway.site.api_urls`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.site.api_urls import api_urlpatterns, dashboard_urlpatterns, urlpatterns

__all__ = ["api_urlpatterns", "dashboard_urlpatterns", "urlpatterns"]
