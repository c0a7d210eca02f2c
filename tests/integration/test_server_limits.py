"""The server layer's limits on anonymous clients, under daphne and uvicorn (issue 22).

Real ``python -m gateway.serve`` processes, raw loopback sockets:

- a request body over ``GATEWAY_MAX_REQUEST_BYTES`` is answered 413
  ``too_large`` in JSON, before authentication, and the server process's
  peak memory (``VmHWM``) stays far below the body the client sent, for
  one body and for three at once;
- a request head that trickles in a line at a time is cut at
  ``GATEWAY_REQUEST_HEAD_TIMEOUT``, and one address may hold only
  ``GATEWAY_MAX_PENDING_PER_ADDRESS`` connections whose head has not ended
  (another address is still served).
"""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.databases import sqlite_database
from tests.support.gateways import SERVERS, GatewayProcess

MIB = 1024 * 1024
#: What the client offers: far over the 16 MiB default limit, and far over
#: what the server may hold for it.
OFFERED = 300 * MIB
CHUNK = 256 * 1024
#: How much the server's peak memory may grow while refusing one big body:
#: the limit itself plus room for the interpreter's own noise.
GROWTH_ALLOWED = 64 * MIB


def peak_rss(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM line")


def send_big_body(
    port: int, path: str, total: int, *, chunked: bool, deadline: float = 60.0
) -> tuple[int, dict[str, str], bytes, int]:
    """POST ``total`` bytes to ``path`` until the server answers; (status, headers, body, sent).

    The client stops sending as soon as the answer is readable, as curl does,
    and gives up at ``deadline`` seconds: the test never waits on a server
    that reads forever.
    """
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {total}\r\n"
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setblocking(False)
    sent = 0
    answer = b""
    pending = (head + "\r\n").encode()
    end = time.monotonic() + deadline
    try:
        while time.monotonic() < end:
            want_write = [sock] if (pending or sent < total) else []
            readable, writable, _ = select.select([sock], want_write, [], 1.0)
            if readable:
                try:
                    got = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not got:
                    break
                answer += got
                if b"\r\n\r\n" in answer:
                    head_part, _, rest = answer.partition(b"\r\n\r\n")
                    length = _content_length(head_part)
                    if length is not None and len(rest) >= length:
                        break
                continue
            if writable:
                if not pending:
                    size = min(CHUNK, total - sent)
                    pending = b"x" * size
                    if chunked:
                        last = b"0\r\n\r\n" if sent + size == total else b""
                        pending = b"%x\r\n" % size + pending + b"\r\n" + last
                    sent += size
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    want_write = []
                    pending = b""
                    sent = total
                    continue
                pending = pending[n:]
    finally:
        sock.close()
    assert b"\r\n\r\n" in answer, f"no answer after sending {sent} bytes: {answer[:200]!r}"
    head_part, _, body = answer.partition(b"\r\n\r\n")
    lines = head_part.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body, sent


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


@pytest.fixture(scope="module", params=SERVERS)
def limited_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway under each server, with the default request limit (16 MiB)."""
    var: Path = tmp_path_factory.mktemp(f"limits-{request.param}")
    with sqlite_database(var) as env:
        env.pop("GATEWAY_MAX_REQUEST_BYTES", None)
        process = GatewayProcess(env, var, name=f"limits-{request.param}", server=request.param)
        process.start()
        try:
            yield process
        finally:
            process.stop()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("path", ["/healthz", "/api/stats"])
def test_a_body_over_the_limit_is_413_json_and_costs_no_memory(
    limited_gateway: GatewayProcess, path: str, chunked: bool
) -> None:
    gateway = limited_gateway
    assert gateway.proc is not None
    before = peak_rss(gateway.proc.pid)
    status, headers, body, sent = send_big_body(gateway.port, path, OFFERED, chunked=chunked)
    after = peak_rss(gateway.proc.pid)
    # Refused before authentication (/api/stats without a token would be 401).
    assert status == 413, (status, body[:300])
    assert headers.get("content-type", "").startswith("application/json")
    error = json.loads(body)
    assert error["error"] == "too_large" and "16777216" in error["detail"], error
    assert after - before < GROWTH_ALLOWED, (
        f"peak RSS grew by {(after - before) / MIB:.0f} MiB for a {sent / MIB:.0f} MiB body"
    )
    if not chunked:
        # A declared length over the limit is refused before the body is read.
        assert sent < OFFERED
    # The process still answers.
    with urllib.request.urlopen(f"{gateway.http}/healthz", timeout=10) as response:
        assert response.status == 200


def test_parallel_big_bodies_cost_no_more_than_the_limit_each(
    limited_gateway: GatewayProcess,
) -> None:
    # Three at once (three 1 GB bodies had taken daphne to 2.1 GB).
    gateway = limited_gateway
    assert gateway.proc is not None
    before = peak_rss(gateway.proc.pid)
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(
                lambda chunked: send_big_body(gateway.port, "/api/stats", OFFERED, chunked=chunked),
                [True, True, False],
            )
        )
    after = peak_rss(gateway.proc.pid)
    assert [status for status, _, _, _ in answers] == [413, 413, 413]
    # At most the limit each, and the interpreter's noise.
    assert after - before < 3 * 16 * MIB + GROWTH_ALLOWED, (after - before) / MIB


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_within_the_limit_reaches_the_application(
    limited_gateway: GatewayProcess, chunked: bool
) -> None:
    # 1 MiB, under the limit: the application answers (401: no token).
    status, _, body, sent = send_big_body(limited_gateway.port, "/api/stats", MIB, chunked=chunked)
    assert sent == MIB
    assert status == 401 and json.loads(body)["error"] == "unauthorized", (status, body[:300])


HEAD_TIMEOUT = 5
PER_ADDRESS = 8


@pytest.fixture(scope="module", params=SERVERS)
def guarded_gateway(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway under each server with a short head deadline and a small per-address cap."""
    var: Path = tmp_path_factory.mktemp(f"heads-{request.param}")
    with sqlite_database(var) as env:
        env["GATEWAY_REQUEST_HEAD_TIMEOUT"] = str(HEAD_TIMEOUT)
        env["GATEWAY_MAX_PENDING_PER_ADDRESS"] = str(PER_ADDRESS)
        process = GatewayProcess(env, var, name=f"heads-{request.param}", server=request.param)
        process.start()
        try:
            yield process
        finally:
            process.stop()


def _partial_head(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection that has sent a request line and no end of head."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    return sock


def _closed_by_server(sock: socket.socket, wait: float) -> bytes | None:
    """What the server sent before closing within ``wait`` seconds, or None if it kept it open."""
    sock.settimeout(wait)
    got = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return got
            got += chunk
    except TimeoutError:
        return None
    except ConnectionResetError:
        return got


def _healthz_from(port: int, source: str) -> int:
    with socket.create_connection(
        ("127.0.0.1", port), timeout=10, source_address=(source, 0)
    ) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        sock.settimeout(10)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_a_head_sent_a_line_at_a_time_is_cut_at_the_deadline(
    guarded_gateway: GatewayProcess,
) -> None:
    # One header line every half second: an idle timeout would never fire.
    sock = _partial_head(guarded_gateway.port)
    closed = False
    try:
        sock.settimeout(0.5)
        for i in range(8 * HEAD_TIMEOUT):  # up to 4 deadlines' worth of lines
            try:
                sock.sendall(b"X-Slow-%d: 1\r\n" % i)
                if sock.recv(4096) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed = True  # the server answered (408) and is closing
            break
    finally:
        sock.close()
    assert closed, "the server kept a connection whose head never ended"


def test_unauthenticated_connections_are_capped_per_address(
    guarded_gateway: GatewayProcess,
) -> None:
    port = guarded_gateway.port
    pending = [_partial_head(port) for _ in range(PER_ADDRESS)]
    try:
        # One more from the same address is refused at once...
        extra = _partial_head(port)
        try:
            answer = _closed_by_server(extra, wait=HEAD_TIMEOUT / 2)
        finally:
            extra.close()
        assert answer is not None, "the connection over the cap was kept"
        if answer:
            assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"] == "unavailable"
        # ... while another address is served.
        assert _healthz_from(port, "127.0.0.2") == 200
    finally:
        for sock in pending:
            sock.close()
    # Their places are free again once they are gone.
    deadline = time.monotonic() + 10
    while True:
        try:
            assert _healthz_from(port, "127.0.0.1") == 200
            break
        except (OSError, IndexError, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
