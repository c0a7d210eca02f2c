"""``/api/schedules`` (protocol 1.2: Schedules): create, replace, read and delete schedules.

Reading needs ``view_queue`` (a stored token's ``admin`` scope, or a staff
session with ``gateway.view_queue``), changing ``change_queue``. The views
run their SQL on the process's scheduler thread (``gateway.engine.schedules``),
which then looks at the schedules at once. Firing is not here: every gateway
process's scheduler fires the ticks.
"""

from __future__ import annotations

import time
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse

from consumers.http import _body, _json, api
from gateway.conf import gateway_settings
from gateway.core.errors import Invalid, NotFound
from gateway.core.protocol import check_name
from gateway.core.schedules import ScheduleRow, parse_schedule, schedule_document
from gateway.core.scopes import Principal
from gateway.runtime import current_runtime
from gateway.store.schedules import all_schedules, delete_schedule, get_schedule, put_schedule
from gateway.store.txn import Txn

__all__ = ["schedule_detail", "schedule_list"]


@api("GET")
async def schedule_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    """``{"schedules": [DOCUMENT, ...]}``, by name."""
    principal.require("view_queue")
    rows = await current_runtime().schedules.call(all_schedules)
    now = time.time()
    return _json({"schedules": [schedule_document(row, now) for row in rows]})


@api("GET", "PUT", "DELETE")
async def schedule_detail(request: HttpRequest, principal: Principal, name: str) -> HttpResponse:
    """GET: the schedule's document. PUT: create or replace it (200, its document).
    DELETE: ``{"deleted": 1}``. 404 ``not_found`` for GET or DELETE of none."""
    check_name(name, "schedule")
    scheduler = current_runtime().schedules
    if request.method == "GET":
        principal.require("view_queue")
        row = await scheduler.call(lambda txn: get_schedule(txn, name))
        if row is None:
            raise NotFound(f"schedule {name!r} does not exist")
        return _json(schedule_document(row, time.time()))
    principal.require("change_queue")
    if request.method == "DELETE":
        deleted = await scheduler.call(lambda txn: _delete(txn, name))
        if not deleted:
            raise NotFound(f"schedule {name!r} does not exist")
        await _audit(principal, name, "Deleted the schedule (API).")
        return _json({"deleted": 1})
    document = _body(request) if request.body else {}
    spec = parse_schedule(name, document, gateway_settings().limits, now=time.time())

    def put(txn: Txn) -> ScheduleRow:
        old = get_schedule(txn, name)
        if old is not None and old.managed:
            raise Invalid(
                f"schedule {name!r} is kept by LEASECAST_SCHEDULES in the Django settings: "
                "change it there"
            )
        return put_schedule(txn, name, spec)

    row = await scheduler.call(put)
    await _audit(principal, name, f"Set the schedule (API): {_summary(document)}.")
    return _json(schedule_document(row, time.time()))


def _delete(txn: Txn, name: str) -> bool:
    old = get_schedule(txn, name)
    if old is not None and old.managed:
        raise Invalid(
            f"schedule {name!r} is kept by LEASECAST_SCHEDULES in the Django settings: "
            "remove it there"
        )
    return delete_schedule(txn, name)


def _summary(document: dict[str, Any]) -> str:
    """The settings of a PUT for the admin log, without its body (which may be large)."""
    shown = {k: v for k, v in document.items() if k != "body"}
    return ", ".join(f"{k}={v!r}" for k, v in sorted(shown.items()))[:500]


async def _audit(principal: Principal, name: str, message: str) -> None:
    """A staff user's change goes to Django's admin log, as the admin's own do."""
    if principal.user_id is None:
        return
    from gateway.host.operations import audit
    from gateway.models import Schedule

    def record() -> None:
        row = Schedule.objects.filter(name=name).first()
        audit(principal.user_id, row if row is not None else f"schedule {name}", message)

    await database_sync_to_async(record)()
