"""The Python client's public helpers: ``leasecast.http_get`` and ``leasecast.backoff_delays``.

``http_get`` is called against a real HTTP server on loopback (the standard
library's, answering what the gateway's API answers); the Django task worker
uses these very objects rather than the client's internals.
"""

from __future__ import annotations

import json
import random
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import islice

import leasecast
import pytest
from leasecast import backoff_delays, http_get
from leasecast.errors import Forbidden, LeasecastError, NotFound


class _Api(BaseHTTPRequestHandler):
    """Answers as the gateway's API would: by path, with the token it was sent."""

    def do_GET(self) -> None:
        if self.path == "/api/queues/jobs":
            self._answer(200, {"name": "jobs", "token": self.headers["Authorization"]})
        elif self.path == "/api/queues/secret":
            self._answer(403, {"error": "forbidden", "detail": "no read on 'secret'"})
        elif self.path == "/api/queues/gone":
            self._answer(404, {"error": "not_found", "detail": "no queue 'gone'"})
        elif self.path == "/proxy-error":
            self._answer(502, None, b"<html>bad gateway</html>")
        else:
            self._answer(200, None, b"not json")

    def _answer(self, status: int, doc: object, raw: bytes | None = None) -> None:
        body = raw if raw is not None else json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_helpers_are_public_names_of_the_package() -> None:
    assert {"http_get", "backoff_delays"} <= set(leasecast.__all__)
    assert http_get.__module__ == "leasecast.api"
    assert http_get.__doc__ and backoff_delays.__doc__


def test_http_get_reads_a_json_document_with_the_bearer_token(api: str) -> None:
    assert http_get(api, "/api/queues/jobs", "lc_t") == {"name": "jobs", "token": "Bearer lc_t"}
    # A ws:// base (a socket URL reused) reaches the same server.
    assert http_get(api.replace("http", "ws"), "/api/queues/jobs", "x")["name"] == "jobs"


def test_http_get_raises_the_error_tree_class_of_the_apis_code(api: str) -> None:
    with pytest.raises(Forbidden, match="no read on 'secret'"):
        http_get(api, "/api/queues/secret", "t")
    with pytest.raises(NotFound, match="no queue 'gone'"):
        http_get(api, "/api/queues/gone", "t")


def test_http_get_says_what_went_wrong_when_the_answer_is_not_the_apis(api: str) -> None:
    with pytest.raises(LeasecastError, match="HTTP 502"):
        http_get(api, "/proxy-error", "t")
    with pytest.raises(LeasecastError, match="did not answer JSON"):
        http_get(api, "/anything", "t")


def test_http_get_of_an_unreachable_gateway_is_a_leasecast_error() -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(LeasecastError, match="cannot reach"):
        http_get(f"http://127.0.0.1:{port}", "/api/stats", "t", timeout=5.0)


def test_backoff_delays_double_up_to_the_maximum_with_jitter() -> None:
    delays = list(islice(backoff_delays(0.5, 4.0, random.Random(3)), 8))
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
