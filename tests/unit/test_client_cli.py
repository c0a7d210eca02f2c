"""The ``leasecast`` command line: arguments, exit codes, and runs against real servers.

The WebSocket commands run against the in-test gateway of ``test_client_worker``;
``stats`` against a stdlib HTTP server in a thread. ``main()`` runs in a worker
thread because it starts its own event loop.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from leasecast.cli import build_parser, main

from tests.support.fake_gateway import TOKEN, FakeGateway, TopicGateway


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEASECAST_URL", raising=False)
    monkeypatch.delenv("LEASECAST_TOKEN", raising=False)


class Api:
    """A stdlib HTTP server answering ``GET`` with canned JSON per path."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, Any]] = {}
        self.requests: list[tuple[str, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.requests.append((self.path, self.headers.get("Authorization")))
                status, body = api.answers.get(self.path, (404, {"error": "not_found"}))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api() -> Iterator[Api]:
    server = Api()
    thread = threading.Thread(target=server.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


# -- arguments ------------------------------------------------------------------


def test_global_options_default_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_parser().parse_args(["stats"]).url == "http://127.0.0.1:8000"
    monkeypatch.setenv("LEASECAST_URL", "http://gw:9000")
    monkeypatch.setenv("LEASECAST_TOKEN", "lc_env")
    ns = build_parser().parse_args(["enqueue", "q", "1", "-", "--key", "k", "--delay", "2.5"])
    assert (ns.url, ns.token, ns.command, ns.queue) == ("http://gw:9000", "lc_env", "enqueue", "q")
    assert (ns.bodies, ns.key, ns.delay) == (["1", "-"], "k", 2.5)
    ns = build_parser().parse_args(["--token", "lc_flag", "stats"])
    assert (ns.token, ns.queue) == ("lc_flag", None)


@pytest.mark.parametrize(
    "bad", [["consume", "q", "--count", "0"], ["consume", "q", "--prefetch", "x"]]
)
def test_bad_numbers_are_usage_errors(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--token", TOKEN, *bad])
    assert exit_.value.code == 2
    assert "leasecast" in capsys.readouterr().err


def test_a_missing_token_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats"]) == 2
    assert "no token" in capsys.readouterr().err


def test_a_body_that_is_not_json_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--token", TOKEN, "--url", "http://127.0.0.1:9", "enqueue", "q", "{oops"]) == 2
    assert "body 1 is not JSON" in capsys.readouterr().err


# -- stats over HTTP --------------------------------------------------------------


def test_stats_prints_the_queue_with_the_bearer_token(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    api.answers["/api/queues/emails"] = (200, {"name": "emails", "visible": 3})
    api.answers["/api/stats"] = (200, {"queues": []})
    assert main(["--url", api.url, "--token", TOKEN, "stats", "emails"]) == 0
    assert json.loads(capsys.readouterr().out) == {"name": "emails", "visible": 3}
    assert main(["--url", api.url.replace("http", "ws"), "--token", TOKEN, "stats"]) == 0
    assert json.loads(capsys.readouterr().out) == {"queues": []}
    assert api.requests == [
        ("/api/queues/emails", f"Bearer {TOKEN}"),
        ("/api/stats", f"Bearer {TOKEN}"),
    ]


def test_stats_errors_exit_1_with_the_gateways_code(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    detail = "token 'narrow' has no scope admin"
    api.answers["/api/stats"] = (403, {"error": "forbidden", "detail": detail})
    api.answers["/api/queues/proxy"] = (502, b"<html>bad gateway</html>")
    assert main(["--url", api.url, "--token", TOKEN, "stats"]) == 1
    assert capsys.readouterr().err == f"leasecast: forbidden: {detail}\n"
    assert main(["--url", api.url, "--token", TOKEN, "stats", "nope"]) == 1
    assert capsys.readouterr().err.startswith("leasecast: not_found")
    assert main(["--url", api.url, "--token", TOKEN, "stats", "proxy"]) == 1
    assert "HTTP 502" in capsys.readouterr().err


def test_an_unreachable_gateway_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:9", "--token", TOKEN, "stats"]) == 1
    assert "cannot reach" in capsys.readouterr().err
    assert main(["--url", "http://127.0.0.1:9", "--token", TOKEN, "enqueue", "q", "1"]) == 1
    assert "cannot connect" in capsys.readouterr().err


# -- enqueue and consume over WebSockets --------------------------------------------


async def test_enqueue_from_arguments_and_stdin(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEASECAST_URL", gateway.http)
    monkeypatch.setenv("LEASECAST_TOKEN", TOKEN)
    monkeypatch.setattr("sys.stdin", io.StringIO('{"b": 2}\n\n"c"\n'))
    assert await asyncio.to_thread(main, ["enqueue", "jobs", '{"a": 1}', "-"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [{"id": f"m{i}", "duplicate": False} for i in (1, 2, 3)]
    assert [m.body for m in gateway.queues["jobs"]] == [{"a": 1}, {"b": 2}, "c"]

    assert await asyncio.to_thread(main, ["enqueue", "jobs", "1", "--key", "k"]) == 0
    assert await asyncio.to_thread(main, ["enqueue", "jobs", "1", "--key", "k"]) == 0
    assert [json.loads(line)["duplicate"] for line in capsys.readouterr().out.splitlines()] == [
        False,
        True,
    ]
    assert await asyncio.to_thread(main, ["enqueue", "jobs", "1", "2", "--key", "k"]) == 2
    assert "--key applies to exactly one body" in capsys.readouterr().err


async def test_enqueue_refusals_exit_1(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--url", gateway.http, "--token", TOKEN, "enqueue", "secret", "1"]
    assert await asyncio.to_thread(main, args) == 1
    assert capsys.readouterr().err == "leasecast: forbidden: token has no scope enqueue:secret\n"
    args = ["--url", gateway.http, "--token", "lc_wrong", "enqueue", "jobs", "1"]
    assert await asyncio.to_thread(main, args) == 1
    err = capsys.readouterr().err
    assert err.startswith("leasecast: unauthorized: ") and "HTTP 403" in err


async def test_consume_prints_and_acks_up_to_count(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    await gateway.put("jobs", {"n": 1}, {"n": 2}, {"n": 3})
    args = ["--url", gateway.http, "--token", TOKEN, "consume", "jobs", "--count", "2"]
    assert await asyncio.to_thread(main, [*args, "--prefetch", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {"queue": "jobs", "id": "m1", "deliveries": 1, "body": {"n": 1}},
        {"queue": "jobs", "id": "m2", "deliveries": 1, "body": {"n": 2}},
    ]
    assert gateway.acked == [{"n": 1}, {"n": 2}]
    assert gateway.paths == ["/ws/queues/jobs/?prefetch=1"]
    args = ["--url", gateway.http, "--token", TOKEN, "consume", "secret"]
    assert await asyncio.to_thread(main, args) == 1
    # Connected, then refused: the gateway closes a forbidden queue's socket (4403).
    assert capsys.readouterr().err.endswith("\nleasecast: forbidden: no secret\n")


async def test_enqueue_with_group_priority_ttl_and_consume_shows_them(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["--url", gateway.http, "--token", TOKEN]
    options = ["--group", "order-7", "--priority", "-5", "--ttl", "90.5"]
    assert await asyncio.to_thread(main, [*base, "enqueue", "jobs", '"one"', *options]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("2\n3\n"))
    assert await asyncio.to_thread(main, [*base, "enqueue", "jobs", "-", "--priority", "9"]) == 0
    assert await asyncio.to_thread(main, [*base, "enqueue", "jobs", '"plain"']) == 0
    capsys.readouterr()
    single, many, plain = gateway.received
    assert {k: single[k] for k in ("group", "priority", "ttl")} == {
        "group": "order-7",
        "priority": -5,
        "ttl": 90.5,
    }
    assert [(m["body"], m["priority"]) for m in many["messages"]] == [(2, 9), (3, 9)]
    assert not {"group", "ttl"} & set(many["messages"][0])
    assert not {"group", "priority", "ttl"} & set(plain)  # nothing new without the options

    assert await asyncio.to_thread(main, [*base, "consume", "jobs", "--count", "4"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [{k: v for k, v in line.items() if k not in ("queue", "id")} for line in lines] == [
        {"deliveries": 1, "body": "one", "group": "order-7", "priority": -5},
        {"deliveries": 1, "body": 2, "priority": 9},
        {"deliveries": 1, "body": 3, "priority": 9},
        {"deliveries": 1, "body": "plain"},
    ]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--priority", "101"], "--priority must be an integer -100..100, not '101'"),
        (["--priority", "1.5"], "--priority must be an integer -100..100, not '1.5'"),
        (["--priority", "high"], "--priority must be an integer -100..100, not 'high'"),
        (["--ttl", "0"], "--ttl must be seconds > 0 and <= 31536000, not '0'"),
        (["--ttl", "-1"], "--ttl must be seconds > 0 and <= 31536000, not '-1'"),
        (["--ttl", "nan"], "--ttl must be seconds > 0 and <= 31536000, not 'nan'"),
        (["--ttl", "soon"], "--ttl must be seconds > 0 and <= 31536000, not 'soon'"),
        (["--group", ""], "--group must be 1-200 characters (it has 0)"),
        (["--group", "g" * 201], "--group must be 1-200 characters (it has 201)"),
    ],
)
async def test_bad_group_priority_or_ttl_exits_2_with_one_line(
    option: list[str], message: str, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--url", gateway.http, "--token", TOKEN, "enqueue", "jobs", "1", *option]
    assert await asyncio.to_thread(main, args) == 2
    assert capsys.readouterr().err == f"leasecast: error: {message}\n"
    assert gateway.handshakes == 0  # refused before connecting


# -- consume --reject / --hold, the connected line (issue 21.6, 21.9) -----------------


async def test_consume_says_on_stderr_that_it_is_connected(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    await gateway.put("jobs", 1)
    args = ["--url", gateway.http, "--token", TOKEN, "consume", "jobs", "--count", "1"]
    assert await asyncio.to_thread(main, args) == 0
    captured = capsys.readouterr()
    assert captured.err == (
        f"leasecast: consuming jobs at {gateway.http} (prefetch 10, each message acked); "
        "Ctrl-C stops\n"
    )
    assert json.loads(captured.out)["body"] == 1  # stdout stays JSON lines only


async def test_consume_reject_dead_letters_each_message(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    await gateway.put("jobs", {"n": 1}, {"n": 2})
    args = ["--url", gateway.http, "--token", TOKEN, "consume", "jobs", "--count", "2"]
    assert await asyncio.to_thread(main, [*args, "--reject"]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["body"] for line in captured.out.splitlines()] == [{"n": 1}, {"n": 2}]
    assert "each message rejected" in captured.err
    assert gateway.dead == [{"n": 1}, {"n": 2}] and gateway.acked == []


async def test_consume_hold_keeps_each_lease_before_acking_it(
    gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    await gateway.put("jobs", "slow")
    args = ["--url", gateway.http, "--token", TOKEN, "consume", "jobs", "--count", "1"]
    assert await asyncio.to_thread(main, [*args, "--hold", "0.2", "--prefetch", "1"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["body"] == "slow"
    assert "each message held 0.2 s, then acked" in captured.err
    assert gateway.acked == ["slow"]
    # The lease outlasts the hold, so the ack after it is not stale.
    assert gateway.paths == ["/ws/queues/jobs/?prefetch=1&visibility_timeout=60.2"]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--hold", "0"], "--hold must be seconds > 0 and <= 3600, not '0'"),
        (["--hold", "3601"], "--hold must be seconds > 0 and <= 3600, not '3601'"),
        (["--hold", "later"], "--hold must be seconds > 0 and <= 3600, not 'later'"),
        (["--hold", "nan"], "--hold must be seconds > 0 and <= 3600, not 'nan'"),
        (["--hold", "1", "--reject"], "--hold and --reject do not go together"),
    ],
)
async def test_bad_consume_options_exit_2_before_connecting(
    option: list[str], message: str, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--url", gateway.http, "--token", TOKEN, "consume", "jobs", *option]
    assert await asyncio.to_thread(main, args) == 2
    assert capsys.readouterr().err == f"leasecast: error: {message}\n"
    assert gateway.handshakes == 0


# -- subscribe --since/--epoch/--after ---------------------------------------------------


async def test_subscribe_resumes_from_since_and_epoch(capsys: pytest.CaptureFixture[str]) -> None:
    async with TopicGateway(history=100) as gateway:
        await gateway.publish("prices", *range(5))  # offsets 1..5
        base = ["--url", gateway.http, "--token", TOKEN, "subscribe", "prices", "--count", "2"]
        assert await asyncio.to_thread(main, [*base, "--since", "2", "--epoch", "e1"]) == 0
        captured = capsys.readouterr()
        lines = [json.loads(line) for line in captured.out.splitlines()]
        assert [(m["body"], m["offset"], m["epoch"]) for m in lines] == [(2, 3, "e1"), (3, 4, "e1")]
        assert "since=2&epoch=e1" in gateway.paths[-1]
        assert captured.err.startswith(f"leasecast: subscribed to prices at {gateway.http}")

        # --after takes a line publish or subscribe printed: the same position.
        after = json.dumps(lines[0])
        assert await asyncio.to_thread(main, [*base, "--after", after]) == 0
        again = [json.loads(line)["offset"] for line in capsys.readouterr().out.splitlines()]
        assert again == [4, 5]
        assert "since=3&epoch=e1" in gateway.paths[-1]


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--since", "3"], "--since needs --epoch (the epoch the offset belongs to)"),
        (["--epoch", "e1"], "--epoch needs --since"),
        (["--since", "-1", "--epoch", "e1"], "--since must be an integer 0..2^63-1, not '-1'"),
        (["--since", "x", "--epoch", "e1"], "--since must be an integer 0..2^63-1, not 'x'"),
        (["--since", "1", "--epoch", ""], "--epoch must be 1-64 characters (it has 0)"),
        (["--after", "{oops"], "--after must be a line that publish or subscribe printed"),
        (["--after", '{"seq": 1}'], "--after: that line has no offset and epoch"),
        (
            ["--after", '{"offset": 1, "epoch": "e"}', "--since", "1"],
            "--after or --since, not both",
        ),
    ],
)
async def test_bad_resume_options_exit_2_before_connecting(
    option: list[str], message: str, gateway: FakeGateway, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--url", gateway.http, "--token", TOKEN, "subscribe", "prices", *option]
    assert await asyncio.to_thread(main, args) == 2
    assert capsys.readouterr().err == f"leasecast: error: {message}\n"
    assert gateway.handshakes == 0
