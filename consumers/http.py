"""The HTTP API (protocol: HTTP, Health and stats). Thin async views over the engine."""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from channels.db import database_sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from consumers.limits import RateLimited, limit_key
from gateway.access.auth import aprincipal_for_user, principal_for_token, token_from_headers
from gateway.conf import gateway_settings
from gateway.core.errors import (
    BadFrame,
    Forbidden,
    Invalid,
    NotFound,
    ProtocolError,
    TooLarge,
    Unauthorized,
)
from gateway.core.protocol import (
    MAX_BATCH,
    EnqueueSpec,
    check_name,
    decode_object,
    parse_enqueue_spec,
)
from gateway.core.scopes import Principal
from gateway.host.task_cancel import tell_cancelled_tasks
from gateway.runtime import current_runtime
from gateway.server.limits import max_request_bytes
from gateway.store import (
    AbortTxn,
    AllStats,
    Browse,
    Cancel,
    CommitTxn,
    Configure,
    DeleteMessage,
    Enqueue,
    MessageCondition,
    Purge,
    Redrive,
    RequeueMessage,
    Stage,
    Stats,
)
from gateway.store.ops import BrowseState
from gateway.topics.settings import load_topic_settings, save_topic_settings

__all__ = [
    "healthz",
    "message_cancel",
    "message_detail",
    "message_requeue",
    "not_found",
    "queue_detail",
    "queue_list",
    "queue_messages",
    "queue_purge",
    "queue_redrive",
    "stats",
    "topic_detail",
    "topic_history",
    "topic_messages",
    "txn_abort",
    "txn_commit",
    "txn_partition",
]

View = Callable[..., Awaitable[HttpResponse]]

TXN_RE = re.compile(r"[A-Za-z0-9._:-]{1,200}")


def error_response(exc: ProtocolError) -> JsonResponse:
    """``{"error": CODE, "detail": ...}`` with the code's HTTP status."""
    response = JsonResponse({"error": exc.code, "detail": exc.detail}, status=exc.http_status)
    if isinstance(exc, RateLimited):
        response["Retry-After"] = exc.retry_after_header()
    return response


def _json(data: Any, status: int = 200) -> HttpResponse:
    return HttpResponse(orjson.dumps(data), status=status, content_type="application/json")


async def _principal(request: HttpRequest) -> Principal:
    """A bearer token, or a staff session (then unsafe methods need the CSRF token)."""
    secret = token_from_headers(
        (k.lower().encode(), v.encode("latin-1")) for k, v in request.headers.items()
    )
    if secret is not None:
        from channels.db import database_sync_to_async

        found: Principal | None = await database_sync_to_async(principal_for_token)(secret)
        if found is None:
            raise Unauthorized("unknown or revoked token")
        return found
    user = await request.auser()
    principal = await aprincipal_for_user(user)
    if principal is None:
        if user is not None and user.is_authenticated:
            raise Forbidden("the API takes staff sessions only; this user is not staff")
        raise Unauthorized("send 'Authorization: Bearer TOKEN' or log in as staff")
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        # The dashboard's purge and redrive: a session alone is not enough for
        # a change, or any page the staff user visits could make it.
        refused = CsrfViewMiddleware(lambda r: HttpResponse()).process_view(
            request, lambda r: HttpResponse(), (), {}
        )
        if refused is not None:
            raise Forbidden("CSRF check failed: a session-authenticated change needs X-CSRFToken")
    return principal


def _charge(principal: Principal, cost: int) -> None:
    """Charge ``cost`` messages to the caller's rate, or raise ``backpressure`` (429)."""
    if cost <= 0:
        return
    limiter = current_runtime().limiter
    decision = limiter.admit(limit_key(principal), cost)
    if not decision.admitted:
        raise RateLimited(principal, decision, limiter.limits.rate)


def api(*methods: str) -> Callable[[View], View]:
    """Authenticate, check the method, and turn ProtocolErrors into JSON errors."""

    def wrap(view: View) -> View:
        @csrf_exempt  # bearer-token clients have no CSRF token; sessions are checked above
        @functools.wraps(view)
        async def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                # Who first: without a token or a staff session, every method of
                # every endpoint is 401 (tests/integration/test_access.py).
                principal = await _principal(request)
                if request.method not in methods:
                    # protocol 1.2: every answer under /api/ is JSON, this one too
                    response = JsonResponse(
                        {"error": "invalid", "detail": f"use {' or '.join(methods)}"},
                        status=405,
                    )
                    response["Allow"] = ", ".join(methods)
                    return response
                _charge(principal, 1)
                return await view(request, principal, *args, **kwargs)
            except ProtocolError as exc:
                return error_response(exc)
            except RequestDataTooBig:
                # Django's own cap (DATA_UPLOAD_MAX_MEMORY_SIZE) would answer an
                # HTML 400 and log a traceback: the client sent too much, say so.
                return error_response(TooLarge("the request body is over the request limit"))

        return wrapped

    return wrap


def _body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object.

    Raises:
        TooLarge: over the request limit (``GATEWAY_MAX_REQUEST_BYTES``): the
            server refuses such a body as it arrives, this is for servers
            that do not (Django's own limit is caught in :func:`api`).
        BadFrame: not UTF-8, not JSON, not an object.
    """
    if len(request.body) > max_request_bytes():
        raise TooLarge("the request body is over the request limit")
    try:
        text = request.body.decode()
    except UnicodeDecodeError as exc:
        raise BadFrame("the request body is not UTF-8") from exc
    return decode_object(text)


async def _audit(principal: Principal, queue: str, message: str) -> None:
    """A staff user's action goes to Django's admin log, like the admin's own."""
    if principal.user_id is None:
        return
    from channels.db import database_sync_to_async

    from gateway.host.operations import audit
    from gateway.models import Queue

    def record() -> None:
        row = Queue.objects.filter(name=queue).first()
        audit(principal.user_id, row if row is not None else f"queue {queue}", message)

    await database_sync_to_async(record)()


async def _audit_topic(principal: Principal, topic: str, message: str) -> None:
    """A staff user's change to a topic goes to Django's admin log."""
    if principal.user_id is None:
        return
    from gateway.host.operations import audit
    from gateway.models import Topic

    def record() -> None:
        row = Topic.objects.filter(name=topic).first()
        audit(principal.user_id, row if row is not None else f"topic {topic}", message)

    await database_sync_to_async(record)()


def _messages(data: dict[str, Any], *, allow_empty: bool) -> list[EnqueueSpec]:
    """The validated ``messages`` list of a request body; errors name the index."""
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise BadFrame("field 'messages' must be a list")
    if not messages and not allow_empty:
        raise Invalid("'messages' is empty")
    if len(messages) > MAX_BATCH:
        raise TooLarge(f"at most {MAX_BATCH} messages per request")
    limits = gateway_settings().limits
    specs = []
    for index, item in enumerate(messages):
        try:
            specs.append(parse_enqueue_spec(item, limits))
        except ProtocolError as exc:
            exc.detail = f"messages[{index}]: {exc.detail}"
            raise
    return specs


async def healthz(request: HttpRequest) -> HttpResponse:
    """200 ``{"status": "ok"}``, no auth."""
    return _json({"status": "ok"})


@api("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
async def not_found(
    request: HttpRequest, principal: Principal, *args: Any, **kwargs: Any
) -> HttpResponse:
    """404 ``not_found`` in JSON for a URL under the API that names no endpoint.

    After authentication, as every endpoint: a caller without a token is told
    401, and learns nothing about which URLs exist.
    """
    raise NotFound(f"no API endpoint at {request.path[:200]!r}")


def _may_see(principal: Principal, queue: str) -> bool:
    """Whether ``principal`` may read ``queue``'s counts (``GET /api/queues/QUEUE``):
    an operator, or a token that may enqueue to it or consume from it."""
    if principal.allows("view_queue"):
        return True
    if principal.user_id is not None:
        return False  # a session's client scopes make no operator
    return principal.allows("enqueue", queue) or principal.allows("consume", queue)


@api("GET")
async def queue_list(request: HttpRequest, principal: Principal) -> HttpResponse:
    """``{"queues": [QUEUE DOCUMENT, ...]}``: every queue the caller may read, by name.

    An ``admin`` sees every queue; any other principal the queues its
    ``enqueue`` or ``consume`` scopes match (each as ``GET /api/queues/QUEUE``).
    """
    queues = await current_runtime().engine.call(AllStats())
    return _json({"queues": [q.as_json() for q in queues if _may_see(principal, q.name)]})


@api("POST", "GET")
async def queue_messages(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """POST: enqueue a batch, all or nothing. GET: browse (protocol 1.1)."""
    check_name(queue)
    if request.method == "GET":
        return await _browse(request, principal, queue)
    principal.require("enqueue", queue)
    specs = _messages(_body(request), allow_empty=False)
    _charge(principal, len(specs) - 1)  # the request paid for one
    results = await current_runtime().engine.call(Enqueue(queue, specs))
    return _json({"results": [r.as_json() for r in results]})


@api("GET", "PATCH")
async def queue_detail(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """GET: counts per state and settings of one queue; 404 for a queue never used.

    PATCH (scope ``admin``): change settings, creating the queue if needed;
    answers the ``GET`` document. Invalid values change nothing.
    """
    check_name(queue)
    engine = current_runtime().engine
    if request.method == "PATCH":
        principal.require("change_queue")
        changes = _body(request) if request.body else {}
        stats = await engine.call(Configure(queue, changes))
        await _audit(principal, queue, f"Changed settings: {orjson.dumps(changes).decode()}.")
        return _json(stats.as_json())
    if not _may_see(principal, queue):
        principal.require_operator("view_queue", "consume", queue)
    return _json((await engine.call(Stats(queue))).as_json())


_BROWSE_STATES: tuple[BrowseState, ...] = ("visible", "delayed", "in_flight", "dead")


#: A number in a path or query: ASCII digits only (``int()`` also takes " 7",
#: "1_000" and other scripts' digits, and ``str.isdigit()`` takes "²"), short
#: enough that ``int()`` never works hard on it.
_DIGITS = re.compile(r"-?[0-9]{1,19}")
#: A number with a fraction or exponent in a query (``if_visible_at``), ASCII only.
_DECIMAL = re.compile(r"-?[0-9]{1,20}(?:\.[0-9]{1,20})?(?:[eE][-+]?[0-9]{1,3})?")
#: Largest number a path or query takes: the store's 64-bit integers.
_I64_MAX = 2**63 - 1


def _number(raw: str, name: str, low: int, high: int) -> int:
    """``raw`` as an integer in ``low..high``, else 400 ``invalid`` naming ``name``."""
    if _DIGITS.fullmatch(raw) is None or not low <= (value := int(raw)) <= high:
        raise Invalid(f"{name} must be an integer {low}..{high}, got {raw[:40]!r}")
    return value


def _query_int(request: HttpRequest, name: str, default: int | None) -> int | None:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    return _number(raw, name, -_I64_MAX, _I64_MAX)


def _condition(request: HttpRequest) -> MessageCondition | None:
    """``if_state``, ``if_deliveries`` and ``if_visible_at`` of a per-message
    action, or None if none is given."""
    raw_state = request.GET.get("if_state")
    state = next((s for s in _BROWSE_STATES if s == raw_state), None)
    if raw_state is not None and state is None:
        raise Invalid(
            f"if_state must be one of {', '.join(_BROWSE_STATES)}, got {raw_state[:40]!r}"
        )
    deliveries = _query_int(request, "if_deliveries", None)
    if deliveries is not None and not 0 <= deliveries < 2**31:
        raise Invalid("if_deliveries must be a delivery count")
    raw_at = request.GET.get("if_visible_at")
    visible_at = None
    if raw_at is not None:
        # A JSON number, as GET .../messages gave it (float() also takes "1_0", " 1", "inf").
        visible_at = float(raw_at) if _DECIMAL.fullmatch(raw_at) else math.nan
        if not math.isfinite(visible_at):
            raise Invalid(f"if_visible_at must be a number, got {raw_at[:40]!r}")
    if state is None and deliveries is None and visible_at is None:
        return None
    return MessageCondition(state, deliveries, visible_at)


async def _browse(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """A page of messages in one state, without leasing them (scope admin or consume)."""
    principal.require_operator("view_queue", "consume", queue)
    raw_state = request.GET.get("state", "visible")
    state = next((s for s in _BROWSE_STATES if s == raw_state), None)
    if state is None:
        raise Invalid(f"state must be one of {', '.join(_BROWSE_STATES)}, got {raw_state[:40]!r}")
    limit = _query_int(request, "limit", 100)
    assert limit is not None
    if not 1 <= limit <= 1000:
        raise Invalid(f"limit must be 1..1000, got {limit}")
    after = _query_int(request, "after", None)
    if after is not None and not 0 <= after < 2**63:
        raise Invalid("after must be a message id")
    page = await current_runtime().engine.call(Browse(queue, state, limit, after))
    return _json(page.as_json())


def _message_id(msg_id: str) -> int:
    """A message id from the path: 400 ``invalid`` unless it is one (then maybe 404)."""
    return _number(msg_id, "a message id", 0, _I64_MAX)


@api("POST")
async def message_requeue(
    request: HttpRequest, principal: Principal, queue: str, msg_id: str
) -> HttpResponse:
    """Requeue one dead or in-flight message, its delivery count reset (scope ``admin``);
    with ``if_*`` parameters, only if it is still as they say."""
    check_name(queue)
    principal.require("change_queue")
    op = RequeueMessage(queue, _message_id(msg_id), _condition(request))
    requeued = await current_runtime().engine.call(op)
    await _audit(principal, queue, f"Requeued message {msg_id} (API): {requeued} changed.")
    return _json({"requeued": requeued})


@api("POST")
async def message_cancel(
    request: HttpRequest, principal: Principal, queue: str, msg_id: str
) -> HttpResponse:
    """Dead-letter one message now with reason ``cancelled``, whatever its state
    (protocol 1.2: Cancel; scope ``admin`` or ``enqueue`` on the queue).

    ``{"cancelled": 1}``, or 0 if it was already dead; 404 if the queue has no
    such message. A lease on it ends, and the socket holding it is sent a
    ``cancel`` frame: here at once, on other processes through the cancel's
    notice (``gateway.engine.notify``).
    """
    check_name(queue)
    principal.require_operator("change_queue", "enqueue", queue)
    number = _message_id(msg_id)
    engine = current_runtime().engine
    result = await engine.call(Cancel(queue, number))
    if result.receipt is not None:
        engine.cancels.tell(queue, str(number), result.receipt)
    elif result.cancelled:
        # A task no worker had yet: its page hears FAILED now (a running
        # one's worker publishes that itself).
        await database_sync_to_async(tell_cancelled_tasks)([number])
    await _audit(principal, queue, f"Cancelled message {number} (API): {result.cancelled} changed.")
    return _json({"cancelled": result.cancelled})


@api("DELETE")
async def message_detail(
    request: HttpRequest, principal: Principal, queue: str, msg_id: str
) -> HttpResponse:
    """Delete one message in any state (scope ``admin``); with ``if_*`` parameters,
    only if it is still as they say."""
    check_name(queue)
    principal.require("change_queue")
    op = DeleteMessage(queue, _message_id(msg_id), _condition(request))
    deleted = await current_runtime().engine.call(op)
    if deleted:
        await _audit(principal, queue, f"Deleted message {msg_id} (API).")
    return _json({"deleted": deleted})


@api("POST")
async def queue_purge(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Delete every message that is not in flight (scope ``admin``)."""
    check_name(queue)
    principal.require("change_queue")
    purged = await current_runtime().engine.call(Purge(queue))
    await _audit(principal, queue, f"Purged {purged} messages (dashboard or API).")
    return _json({"purged": purged})


@api("POST")
async def queue_redrive(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Move every dead message back to visible (scope ``admin``)."""
    check_name(queue)
    principal.require("change_queue")
    redriven = await current_runtime().engine.call(Redrive(queue))
    await _audit(principal, queue, f"Redrove {redriven} dead messages (dashboard or API).")
    return _json({"redriven": redriven})


@api("POST")
async def topic_messages(request: HttpRequest, principal: Principal, topic: str) -> HttpResponse:
    """Publish a batch to a topic, in order (protocol: Publish).

    The batch is one publish to the broadcaster: a subscriber keeping up
    receives it in as few ``messages`` frames as its credit allows.
    """
    check_name(topic, "topic")
    principal.require("publish", topic)
    bodies = [spec.body_json for spec in _messages(_body(request), allow_empty=False)]
    _charge(principal, len(bodies) - 1)  # the request paid for one
    # The reply stays v1's: the offsets are in GET /api/topics/TOPIC.
    await current_runtime().broadcaster.publish(topic, bodies)
    return _json({"published": len(bodies)})


async def _topic_document(topic: str) -> dict[str, Any]:
    broadcaster = current_runtime().broadcaster
    settings = await broadcaster.settings.get(topic)
    head = await broadcaster.head(topic)
    return {"name": topic, **settings.as_json(), "epoch": head.epoch, "offset": head.offset}


@api("GET", "PATCH")
async def topic_detail(request: HttpRequest, principal: Principal, topic: str) -> HttpResponse:
    """GET (scope ``subscribe`` or ``publish`` on it): the topic's settings, epoch and offset.

    PATCH (scope ``admin``): change ``history_size`` / ``history_ttl``;
    answers the ``GET`` document. Invalid values are 400 and change nothing.
    """
    check_name(topic, "topic")
    if request.method == "PATCH":
        principal.require("change_topic")
        changes = _body(request) if request.body else {}
        cache = current_runtime().broadcaster.settings
        current = await database_sync_to_async(load_topic_settings)(topic)
        settings = current.changed(changes)
        await database_sync_to_async(save_topic_settings)(topic, settings)
        cache.put(topic, settings)  # at once on this process
        await _audit_topic(principal, topic, f"Changed settings: {orjson.dumps(changes).decode()}.")
        return _json(await _topic_document(topic))
    if not principal.allows("subscribe", topic):
        principal.require("publish", topic)
    return _json(await _topic_document(topic))


@api("GET")
async def topic_history(request: HttpRequest, principal: Principal, topic: str) -> HttpResponse:
    """The kept messages after ``since`` (exclusive), oldest first (scope ``subscribe``)."""
    check_name(topic, "topic")
    principal.require("subscribe", topic)
    since = _query_int(request, "since", None)
    if since is not None and not 0 <= since < 2**63:
        raise Invalid("since must be an offset >= 0")
    limit = _query_int(request, "limit", 100)
    assert limit is not None
    if not 1 <= limit <= 1000:
        raise Invalid(f"limit must be 1..1000, got {limit}")
    head, entries = await current_runtime().broadcaster.history(topic, since, limit)
    items = b",".join(b'{"offset":%d,"body":%s}' % (e.offset, e.body) for e in entries)
    document = b'{"epoch":%s,"offset":%d,"items":[%s]}' % (
        orjson.dumps(head.epoch),
        head.offset,
        items,
    )
    return HttpResponse(document, content_type="application/json")


def _check_txn(txn: str) -> str:
    if TXN_RE.fullmatch(txn) is None:
        raise Invalid("transaction names are 1-200 characters of [A-Za-z0-9._:-]")
    return txn


#: Partition numbers: the store keeps them in a 32-bit column.
_MAX_PARTITION = 2**31 - 1


def _owner(principal: Principal) -> str:
    """Who owns the transactions ``principal`` stages into (protocol 1.2: General):
    the signed token's subject, the stored token, or the staff user."""
    if principal.subject is not None:
        subject = principal.subject
        if len(subject) > 200:  # the column is bounded; a digest names it as well
            subject = "sha256:" + hashlib.sha256(subject.encode()).hexdigest()
        return f"sub:{subject}"
    if principal.token_id is not None:
        return f"token:{principal.token_id}"
    if principal.user_id is not None:
        return f"user:{principal.user_id}"
    return f"name:{principal.name[:200]}"


@api("PUT")
async def txn_partition(
    request: HttpRequest, principal: Principal, txn: str, partition: str
) -> HttpResponse:
    """Stage one partition of a transaction, replacing what it staged before (docs/protocol.md).

    The first principal to stage into ``txn`` owns it; any other is ``forbidden``.
    """
    _check_txn(txn)
    number = _number(partition, "partition", 0, _MAX_PARTITION)
    data = _body(request)
    queue = check_name(data.get("queue"))
    principal.require("enqueue", queue)
    specs = _messages(data, allow_empty=True)  # a partition may stage nothing
    _charge(principal, len(specs) - 1)  # the request paid for one
    op = Stage(txn, number, queue, specs, _owner(principal))
    result = await current_runtime().engine.call(op)
    return _json({"staged": result.messages, "state": result.state, "already": result.already})


def _may_enqueue_somewhere(principal: Principal) -> None:
    if not principal.is_admin and not any(g.action == "enqueue" for g in principal.grants):
        raise Forbidden(f"token {principal.name!r} has no enqueue scope")


def _commit_partitions(request: HttpRequest) -> frozenset[int] | None:
    """The optional ``partitions`` list of a commit body: the only partitions to commit."""
    if not request.body:
        return None
    partitions = _body(request).get("partitions")
    if partitions is None:
        return None
    if not isinstance(partitions, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) for p in partitions
    ):
        raise BadFrame("field 'partitions' must be a list of integers")
    if any(not 0 <= p <= _MAX_PARTITION for p in partitions):
        raise Invalid(f"partition numbers are 0..{_MAX_PARTITION}")
    return frozenset(partitions)


@api("POST")
async def txn_commit(request: HttpRequest, principal: Principal, txn: str) -> HttpResponse:
    """Make everything staged under ``txn`` visible at once; idempotent. Its owner only."""
    _check_txn(txn)
    _may_enqueue_somewhere(principal)
    op = CommitTxn(txn, _commit_partitions(request), _owner(principal))
    result = await current_runtime().engine.call(op)
    return _json({"committed": result.messages, "already": result.already})


@api("POST")
async def txn_abort(request: HttpRequest, principal: Principal, txn: str) -> HttpResponse:
    """Discard what is staged under ``txn``. Its owner only, or an ``admin``."""
    _check_txn(txn)
    _may_enqueue_somewhere(principal)
    op = AbortTxn(txn, _owner(principal), any_owner=principal.is_admin)
    result = await current_runtime().engine.call(op)
    return _json({"aborted": result.messages, "already": result.already})


@api("GET")
async def stats(request: HttpRequest, principal: Principal) -> HttpResponse:
    """Queues and every connected socket of this process (scope ``admin``)."""
    principal.require("view_queue")
    engine = current_runtime().engine
    data: dict[str, Any] = {"queues": [s.as_json() for s in await engine.call(AllStats())]}
    broadcaster = current_runtime().broadcaster
    data["topics"] = broadcaster.describe_topics()
    data["sockets"] = [socket.describe() for socket in engine.sockets]
    limiter = current_runtime().limiter
    data["process"] = engine.describe() | {
        "slow_consumers_closed": broadcaster.slow_consumers_closed,
        "relay": broadcaster.relay_figures(),
        "token_limits": {
            "max_sockets": limiter.limits.max_sockets,
            "rate": limiter.limits.rate,
            "burst": limiter.limits.capacity if limiter.limits.limits_rate else 0,
            "refused_sockets": limiter.refused_sockets,
            "refused_messages": limiter.refused_messages,
        },
    }
    return _json(data)
