"""``gateway.host.producer``'s remote mode against a scripted HTTP server (not a gateway).

The real gateway is in tests/integration/test_producer.py; here the server
answers what a proxy or a wrong ``LEASECAST_URL`` would: HTML error pages,
503s, a lost reply. Each request is recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.test import override_settings

from gateway.core.errors import Backpressure, NotFound, ProtocolError, Unavailable
from gateway.core.protocol import EnqueueSpec
from gateway.host import producer

#: (status, content type, body) answered to each request in turn; the last repeats.
Script = list[tuple[int, str, bytes]]


class ScriptedServer:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                owner.requests.append(
                    {
                        "path": self.path,
                        "auth": self.headers["Authorization"],
                        "body": json.loads(self.rfile.read(length)),
                    }
                )
                status, kind, body = owner.script[min(len(owner.requests), len(script)) - 1]
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setattr(producer.time, "sleep", lambda seconds: None)  # no backoff waits
    servers: list[ScriptedServer] = []

    def start(script: Script) -> ScriptedServer:
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def ok(*results: tuple[str, bool]) -> tuple[int, str, bytes]:
    body = {"results": [{"id": i, "duplicate": d} for i, d in results]}
    return 200, "application/json", json.dumps(body).encode()


def enqueue(server: ScriptedServer, *specs: EnqueueSpec) -> list[Any]:
    with override_settings(LEASECAST_URL=server.url + "/", LEASECAST_TOKEN="lc_t"):
        return producer._enqueue_remote("orders", list(specs) or [EnqueueSpec(b'{"n":1}')])


def test_the_request_carries_the_token_the_fields_and_a_key(serve: Any) -> None:
    server = serve([ok(("1", False), ("2", True))])
    results = enqueue(
        server,
        EnqueueSpec(b'{"n":1}', delay=5, group="g", priority=3, ttl=60),
        EnqueueSpec(b"[]", key="mine"),
    )
    assert [(r.id, r.duplicate) for r in results] == [("1", False), ("2", True)]
    (request,) = server.requests
    assert (request["path"], request["auth"]) == ("/api/queues/orders/messages", "Bearer lc_t")
    first, second = request["body"]["messages"]
    assert first["key"].startswith("lc-") and len(first["key"]) > 30
    assert {k: v for k, v in first.items() if k != "key"} == {
        "body": {"n": 1},
        "delay": 5,
        "group": "g",
        "priority": 3,
        "ttl": 60,
    }
    # A caller's own key is kept, and a duplicate of it is reported as one.
    assert second == {"body": [], "key": "mine"}


def test_a_503_is_retried_with_the_same_keys_and_a_made_up_keys_duplicate_is_new(
    serve: Any,
) -> None:
    unavailable = (503, "application/json", b'{"error": "unavailable", "detail": "db"}')
    server = serve([unavailable, ok(("7", True))])
    (result,) = enqueue(server)
    assert (result.id, result.duplicate) == ("7", False)
    first, second = (r["body"]["messages"][0]["key"] for r in server.requests)
    assert first == second


def test_a_proxys_html_error_page_is_unavailable_and_retried(serve: Any) -> None:
    server = serve([(502, "text/html", b"<html>Bad Gateway</html>")])
    with pytest.raises(Unavailable, match="HTTP 502"):
        enqueue(server)
    assert len(server.requests) == producer.REMOTE_ATTEMPTS


def test_a_url_that_is_not_a_gateway_says_so_at_once(serve: Any) -> None:
    server = serve([(404, "text/html", b"<html>Not Found</html>")])
    with pytest.raises(NotFound, match="not a Leasecast reply"):
        enqueue(server)
    server = serve([(400, "text/html", b"<html>Bad Request</html>")])
    with pytest.raises(ProtocolError, match="HTTP 400"):
        enqueue(server)
    assert len(server.requests) == 1


def test_a_full_queue_is_not_retried(serve: Any) -> None:
    server = serve([(429, "application/json", b'{"error": "backpressure", "detail": "full"}')])
    with pytest.raises(Backpressure, match="full"):
        enqueue(server)
    assert len(server.requests) == 1
