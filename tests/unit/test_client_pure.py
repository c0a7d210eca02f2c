"""The client's pure pieces: URLs, backoff, ref matching, CLI arguments."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from leasecast import Producer, Worker
from leasecast.cli import UsageError, build_parser, enqueue_options, parse_bodies
from leasecast.link import (
    PendingReplies,
    backoff_delays,
    http_url,
    name_path,
    permanent,
    ws_url,
)

from gateway.core.errors import ConnectionClosed, Forbidden, Invalid, Unauthorized, Unavailable


def test_urls_from_any_base() -> None:
    assert ws_url("http://h:8000", "/ws/produce/") == "ws://h:8000/ws/produce/"
    assert ws_url("https://h", "/ws/q/", {"prefetch": 5, "visibility_timeout": None}) == (
        "wss://h/ws/q/?prefetch=5"
    )
    assert ws_url("h:1", "/x") == "ws://h:1/x"
    assert http_url("ws://h:8000/", "/api/stats") == "http://h:8000/api/stats"
    assert http_url("wss://h", "/healthz") == "https://h/healthz"


def test_backoff_doubles_to_a_cap_with_jitter() -> None:
    delays = backoff_delays(0.1, 1.0, random.Random(7))
    got = [next(delays) for _ in range(8)]
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0, 1.0]
    assert all(c / 2 <= d <= c for d, c in zip(got, ceilings, strict=True))


def test_permanent_errors_are_not_retried() -> None:
    assert permanent(Unauthorized()) and permanent(Forbidden()) and permanent(Invalid())
    assert not permanent(ConnectionClosed()) and not permanent(Unavailable())


def test_bodies_from_arguments_and_stdin() -> None:
    assert parse_bodies(['{"a": 1}', "-", "3"], ["1\n", "\n", '"x"\n']) == [{"a": 1}, 1, "x", 3]
    with pytest.raises(UsageError, match="body 2"):
        parse_bodies(["1", "{oops"], [])


def test_enqueue_options_as_the_gateway_reads_them() -> None:
    assert enqueue_options(None, None, None) == (None, 0, None)
    assert enqueue_options("g", "-100", "0.5") == ("g", -100, 0.5)
    assert enqueue_options("x" * 200, "100", str(365 * 24 * 3600)) == ("x" * 200, 100, 31536000.0)
    ns = build_parser().parse_args(["enqueue", "q", "1", "--priority", "-7", "--group", "g"])
    assert (ns.group, ns.priority, ns.ttl) == ("g", "-7", None)  # checked later, in one line
    for bad in [("", None, None), (None, "-101", None), (None, None, "31536001")]:
        with pytest.raises(UsageError):
            enqueue_options(*bad)


def test_parser_reads_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEASECAST_TOKEN", "lc_x")
    monkeypatch.setenv("LEASECAST_URL", "http://h:1")
    ns = build_parser().parse_args(["consume", "q", "--count", "2"])
    assert (ns.token, ns.url, ns.queue, ns.count, ns.prefetch) == ("lc_x", "http://h:1", "q", 2, 10)


def test_backoff_never_starts_above_its_cap() -> None:
    delays = backoff_delays(10.0, 2.0, random.Random(1))
    assert all(1.0 <= next(delays) <= 2.0 for _ in range(20))


def test_names_are_quoted_into_paths() -> None:
    assert name_path("/ws/queues/", "emails.high-1") == "/ws/queues/emails.high-1/"
    assert name_path("ws/topics", "a b/c") == "/ws/topics/a%20b%2Fc/"
    # The fast path asks for batches of up to prefetch deliveries; batch=False is v1.
    assert Worker("h:1", "a b", token="t").url == "ws://h:1/ws/queues/a%20b/?prefetch=10&batch=10"
    assert Worker("h:1", "a", token="t", batch=False).url == "ws://h:1/ws/queues/a/?prefetch=10"
    assert Worker("h:1", "a", token="t", prefetch=1).url == "ws://h:1/ws/queues/a/?prefetch=1"
    assert "batch=1000&" not in Worker("h:1", "a", token="t", prefetch=5000).url
    assert Worker("h:1", "a", token="t", prefetch=5000).url.endswith("prefetch=5000&batch=1000")
    assert Producer("https://h/ignored?x=1", token="t").url == "wss://h/ws/produce/"


async def test_replies_resolve_their_own_request_in_any_order() -> None:
    pending = PendingReplies()
    (r1, f1), (r2, f2), (r3, f3) = pending.new(), pending.new(), pending.new()
    assert (r1, r2, r3) == (1, 2, 3)
    assert pending.resolve({"op": "nacked", "ref": r3})
    assert not pending.resolve({"op": "deliver", "id": "m1"})  # pushed, not a reply
    assert pending.resolve({"op": "error", "code": "stale_receipt", "ref": r1})
    assert (f1.result()["op"], f2.done(), f3.result()["op"]) == ("error", False, "nacked")
    # Not ours: never issued, another type, or a boolean (True == 1 in Python).
    for ref in (99, "1", 1.0, True, None):
        assert not pending.resolve({"op": "acked", "ref": ref})
    assert not f2.done()
    # A resolved reply stays until it is claimed, even if the socket closes.
    pending.fail_all(ConnectionError("closed"))
    assert f3.result()["op"] == "nacked"
    with pytest.raises(ConnectionError):
        f2.result()
    # A late or repeated reply to a request given up on is still swallowed.
    pending.discard(r1)
    assert pending.resolve({"op": "acked", "ref": r1}) and len(pending) == 2


def test_the_client_imports_without_django() -> None:
    code = (
        "import sys, leasecast, leasecast.cli;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('django', 'channels', 'gateway')];"
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_clis_limits_are_the_gateways() -> None:
    # The client cannot import gateway.core.protocol; its copies must not drift.
    from leasecast import cli

    from gateway.core import protocol

    assert cli.MAX_GROUP_LENGTH == protocol.MAX_GROUP_LENGTH
    assert cli.MAX_PRIORITY == protocol.MAX_PRIORITY
    assert cli.MAX_TTL == protocol.MAX_TTL


def test_gateway_errors_are_the_clients_classes() -> None:
    # One error tree: what the gateway raises is what a client catches.
    import leasecast.errors

    import gateway.core.errors

    for name in leasecast.errors.__all__:
        assert getattr(gateway.core.errors, name) is getattr(leasecast.errors, name)
