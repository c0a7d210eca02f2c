"""``GET /metrics`` (protocol 1.1: Metrics): the deployment in Prometheus text format.

Scope ``admin`` or the bare scope ``metrics``, or nobody's when
``GATEWAY_METRICS_PUBLIC=1``. A refusal is the API's usual 401 or 403 JSON
error, which names no queue, topic or process.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from consumers.http import _charge, _principal, error_response
from gateway.conf import gateway_settings
from gateway.core.errors import Forbidden, ProtocolError
from gateway.runtime import current_runtime
from gateway.runtime import metrics as gateway_metrics

__all__ = ["metrics"]


@csrf_exempt
async def metrics(request: HttpRequest) -> HttpResponse:
    """The deployment's metrics (see ``gateway.runtime.metrics``)."""
    try:
        if not gateway_settings().metrics_public:
            # Who first, as every API endpoint: 401 before 405.
            principal = await _principal(request)
            if not principal.allows("metrics"):
                raise Forbidden("this token has no 'metrics' or 'admin' scope")
            _charge(principal, 1)
        if request.method not in ("GET", "HEAD"):
            return JsonResponse({"error": "bad_frame", "detail": "use GET"}, status=405)
        figures = current_runtime().metrics
        body = await database_sync_to_async(gateway_metrics.scrape)(figures)
    except ProtocolError as exc:
        return error_response(exc)
    response = HttpResponse(body, content_type=gateway_metrics.CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
