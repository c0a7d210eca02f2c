"""The shop's routes, its own admin, and Leasecast's HTTP API and dashboard."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from orders import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place_order),
    path("orders/<int:pk>", views.order_detail),
    path("tasks/<str:result_id>", views.task_result),
    path("orders/pack/", views.packing),
    path("orders/pack/<str:result_id>/token", views.pack_token),
    # Leasecast: /healthz, /api/queues/..., /api/topics/..., /dashboard/ (at the
    # root: clients use these paths).
    path("", include("gateway.api_urls")),
]
