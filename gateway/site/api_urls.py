"""Leasecast's HTTP routes without the Django admin, for a project that has its own.

A Django project that installs Leasecast includes them at its root (the
protocol fixes the paths: clients call ``/api/queues/...``)::

    urlpatterns = [
        path("admin/", admin.site.urls),  # the project's own admin
        path("", include("gateway.api_urls")),  # /healthz, /api/..., /dashboard/
    ]

``api_urlpatterns`` alone leaves out the dashboard (which needs the
``dashboard`` app and ``django.contrib.admin``). The standalone service's
``gateway.site.urls`` is these routes plus the admin.
"""

from __future__ import annotations

from django.urls import URLPattern, path

from consumers import http, http_workers, task_views
from consumers import metrics as metrics_views
from consumers import presence as presence_views
from consumers import schedules as schedule_views
from consumers import sse as sse_views
from dashboard import views as dashboard_views

__all__ = ["api_urlpatterns", "dashboard_urlpatterns", "urlpatterns"]

# django-stubs types path() for sync views only; the API views are async.
api_urlpatterns: list[URLPattern] = [
    path("healthz", http.healthz),
    path("api/stats", http.stats),  # type: ignore[arg-type]
    path("metrics", metrics_views.metrics),
    path("api/queues", http.queue_list),  # type: ignore[arg-type]
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
    path(
        "api/queues/<str:queue>/messages/<str:msg_id>/cancel",
        http.message_cancel,  # type: ignore[arg-type]
    ),
    # HTTP workers (protocol 1.2): lease and end leases without a socket.
    path("api/queues/<str:queue>/lease", http_workers.lease),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/ack", http_workers.ack),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/nack", http_workers.nack),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/reject", http_workers.reject),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/extend", http_workers.extend),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/purge", http.queue_purge),  # type: ignore[arg-type]
    path("api/queues/<str:queue>/redrive", http.queue_redrive),  # type: ignore[arg-type]
    path("api/topics/<str:topic>", http.topic_detail),  # type: ignore[arg-type]
    path("api/topics/<str:topic>/messages", http.topic_messages),  # type: ignore[arg-type]
    path("api/topics/<str:topic>/history", http.topic_history),  # type: ignore[arg-type]
    path("api/topics/<str:topic>/presence", presence_views.topic_presence),  # type: ignore[arg-type]
    # Server-sent events (protocol 1.2): a topic's messages as text/event-stream.
    path("sse/topics/<str:topic>/", sse_views.topic_events),
    path(
        # str, not int: the view answers 400 for a partition that is no number
        "api/transactions/<str:txn>/partitions/<str:partition>",
        http.txn_partition,  # type: ignore[arg-type]
    ),
    path("api/transactions/<str:txn>/commit", http.txn_commit),  # type: ignore[arg-type]
    path("api/transactions/<str:txn>/abort", http.txn_abort),  # type: ignore[arg-type]
    path("api/schedules", schedule_views.schedule_list),  # type: ignore[arg-type]
    path("api/schedules/<str:name>", schedule_views.schedule_detail),  # type: ignore[arg-type]
    path("api/tasks", task_views.task_list),  # type: ignore[arg-type]
    path("api/tasks/<str:result_id>/retry", task_views.task_retry),  # type: ignore[arg-type]
    # Last: any other URL under Leasecast's own API prefixes answers a JSON 404
    # (protocol 1.2: every answer under /api/ is JSON). Only these prefixes: the
    # rest of /api/ may belong to the project that includes these routes. The
    # standalone service answers JSON for all of /api/ (gateway.site.urls).
    path("api/queues/<str:queue>/<path:rest>", http.not_found),  # type: ignore[arg-type]
    path("api/topics/<str:topic>/<path:rest>", http.not_found),  # type: ignore[arg-type]
    path("api/transactions/<path:rest>", http.not_found),  # type: ignore[arg-type]
    path("api/stats/<path:rest>", http.not_found),  # type: ignore[arg-type]
    path("api/schedules/<path:rest>", http.not_found),  # type: ignore[arg-type]
    path("api/tasks/<path:rest>", http.not_found),  # type: ignore[arg-type]
]

dashboard_urlpatterns: list[URLPattern] = [
    path("dashboard/", dashboard_views.index, name="dashboard"),
]

urlpatterns = [*api_urlpatterns, *dashboard_urlpatterns]
