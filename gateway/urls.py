"""HTTP routes: the API, health, the dashboard and the Django admin."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from consumers import http
from dashboard import views as dashboard_views

# django-stubs types path() for sync views only; the API views are async.
urlpatterns = [
    path("healthz", http.healthz),
    path("api/stats", http.stats),  # type: ignore[arg-type]
    path("api/queues/<str:queue>", http.queue_detail),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/messages", http.queue_messages),  # type: ignore[arg-type]
    path(
        "api/queues/<str:queue>/messages/<str:msg_id>",
        http.message_detail,  # type: ignore[arg-type]
    ),
    path(
        "api/queues/<str:queue>/messages/<str:msg_id>/requeue",
        http.message_requeue,  # type: ignore[arg-type]
    ),
    path("api/queues/<str:queue>/purge", http.queue_purge),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/redrive", http.queue_redrive),  # type: ignore[arg-type]
    path("api/topics/<str:topic>/messages", http.topic_messages),  # type: ignore[arg-type]
    path(
        "api/transactions/<str:txn>/partitions/<int:partition>",
        http.txn_partition,  # type: ignore[arg-type]
    ),
    path("api/transactions/<str:txn>/commit", http.txn_commit),  # type: ignore[arg-type]
    path("api/transactions/<str:txn>/abort", http.txn_abort),  # type: ignore[arg-type]
    path("dashboard/", dashboard_views.index, name="dashboard"),
    path("admin/", admin.site.urls),
]
