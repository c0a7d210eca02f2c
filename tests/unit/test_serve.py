"""daphne's and uvicorn's command lines as ``python -m gateway.serve`` builds them."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.server.options import shutdown_grace
from gateway.server.serve import daphne_args, split_server, uvicorn_args


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_defaults_keep_sockets_open_and_bound_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GATEWAY_MAX_FRAME_BYTES", "GATEWAY_WEBSOCKET_MAX_AGE", "GATEWAY_PING_INTERVAL"):
        monkeypatch.delenv(name, raising=False)
    args = daphne_args(["-p", "9000"])
    # daphne would close every socket after 24 h: a worker lives as long as it runs.
    assert option(args, "--websocket_timeout") == "-1"
    assert option(args, "--websocket-max-message-size") == str(8 * 1024 * 1024)
    assert option(args, "--ping-interval") == "20"
    assert args[-1] == "gateway.asgi:application"


def test_the_callers_options_and_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_WEBSOCKET_MAX_AGE", "3600")
    assert option(daphne_args([]), "--websocket_timeout") == "3600"
    args = daphne_args(["--websocket_timeout", "60", "other.asgi:app"])
    assert args.count("--websocket_timeout") == 1 and option(args, "--websocket_timeout") == "60"
    assert args[-1] == "other.asgi:app"


def test_server_is_daphne_unless_chosen() -> None:
    assert split_server(["-p", "9000"]) == ("daphne", ["-p", "9000"])
    assert split_server(["--server", "uvicorn", "-p", "1"]) == ("uvicorn", ["-p", "1"])
    assert split_server(["--server=uvicorn"]) == ("uvicorn", [])
    with pytest.raises(SystemExit, match="--server must be one of"):
        split_server(["--server", "hypercorn"])


def test_uvicorn_gets_the_same_limits_and_daphnes_spelling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("GATEWAY_MAX_FRAME_BYTES", "GATEWAY_PING_INTERVAL", "GATEWAY_SHUTDOWN_GRACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GATEWAY_PING_TIMEOUT", "7")
    args = uvicorn_args(["-b", "0.0.0.0", "-p", "9000"])
    assert args[0] == "gateway.asgi:application"
    assert option(args, "--host") == "0.0.0.0" and option(args, "--port") == "9000"
    assert option(args, "--ws-max-size") == str(8 * 1024 * 1024)
    assert option(args, "--ws-ping-interval") == "20"
    assert option(args, "--ws-ping-timeout") == "7"
    assert option(args, "--lifespan") == "off"
    assert option(args, "--timeout-graceful-shutdown") == "30"
    assert option(args, "--ws-per-message-deflate") == "false"
    # asyncio's loop even where uvloop is installed (uvicorn's "auto" takes it)
    assert option(args, "--loop") == "asyncio"
    assert option(uvicorn_args(["--loop", "uvloop"]), "--loop") == "uvloop"


def test_uvicorn_callers_options_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SHUTDOWN_GRACE", "2.5")
    args = uvicorn_args(["--ws", "wsproto", "--ws-max-size=1000", "other.asgi:app"])
    assert args.count("--ws") == 1 and option(args, "--ws") == "wsproto"
    assert "--ws-max-size=1000" in args and "--ws-max-size" not in args
    assert option(args, "--timeout-graceful-shutdown") == "3"  # whole seconds, rounded up
    assert args[-1] == "other.asgi:app" and "gateway.asgi:application" not in args


def test_shutdown_grace_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_SHUTDOWN_GRACE", raising=False)
    assert shutdown_grace() == 30
    monkeypatch.setenv("GATEWAY_SHUTDOWN_GRACE", "0")
    assert shutdown_grace() == 0
    for bad in ("soon", "-1"):
        monkeypatch.setenv("GATEWAY_SHUTDOWN_GRACE", bad)
        with pytest.raises(ValueError, match="GATEWAY_SHUTDOWN_GRACE"):
            shutdown_grace()


def test_pending_heads_are_capped_per_address() -> None:
    from gateway.server.limits import PendingHeads

    pending = PendingHeads(2)
    assert pending.acquire("10.0.0.1") and pending.acquire("10.0.0.1")
    assert not pending.acquire("10.0.0.1")  # the third waits for nothing: refused
    assert pending.acquire("10.0.0.2")  # another address is not affected
    pending.release("10.0.0.1")
    assert pending.acquire("10.0.0.1")
    for _ in range(3):
        pending.release("10.0.0.1")
    assert pending.counts == {"10.0.0.2": 1}  # no address is kept at zero
    unlimited = PendingHeads(0)
    assert all(unlimited.acquire("a") for _ in range(10_000))


def test_server_limit_settings_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from gateway.server.limits import (
        default_max_pending_per_address,
        head_timeout,
        max_pending_per_address,
        max_request_bytes,
    )

    for name in (
        "GATEWAY_MAX_REQUEST_BYTES",
        "GATEWAY_REQUEST_HEAD_TIMEOUT",
        "GATEWAY_MAX_PENDING_PER_ADDRESS",
    ):
        monkeypatch.delenv(name, raising=False)
    assert (max_request_bytes(), head_timeout(), max_pending_per_address()) == (
        16 * 1024 * 1024,
        20.0,
        default_max_pending_per_address(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
    )
    for name, bad in (
        ("GATEWAY_MAX_REQUEST_BYTES", "0"),
        ("GATEWAY_MAX_REQUEST_BYTES", "16M"),
        ("GATEWAY_REQUEST_HEAD_TIMEOUT", "-1"),
        ("GATEWAY_REQUEST_HEAD_TIMEOUT", "nan"),
        ("GATEWAY_MAX_PENDING_PER_ADDRESS", "-5"),
    ):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            (max_request_bytes(), head_timeout(), max_pending_per_address())
        monkeypatch.delenv(name)


def test_the_default_per_address_cap_is_a_quarter_of_the_file_limit_within_bounds() -> None:
    from gateway.server.limits import default_max_pending_per_address

    # 1,024 files (a common soft limit): one address holds at most 256 of them
    # with unfinished heads; a raised limit lets a balancer's burst through.
    assert default_max_pending_per_address(1024) == 256
    assert default_max_pending_per_address(100) == 64
    assert default_max_pending_per_address(20_000) == 1024
    assert default_max_pending_per_address(1 << 20) == 1024


def test_serving_raises_the_soft_file_limit_to_the_hard_one() -> None:
    import resource

    from gateway.server.limits import raise_file_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert raise_file_limit() == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_body_limit_answers_413_once_a_streamed_body_passes_it() -> None:
    from gateway.server.limits import BodyLimit

    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = [{"type": "http.request", "body": b"x" * 40, "more_body": True} for _ in range(5)]

    async def receive() -> Any:
        return chunks.pop(0)

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "headers": [(b"transfer-encoding", b"chunked")]}
    await BodyLimit(app, 100)(scope, receive, send)
    assert seen == ["http.request", "http.request", "http.disconnect"]
    assert [m.get("status") for m in sent] == [413, None]  # the app's own answer is dropped
    assert b'"too_large"' in sent[1]["body"]

    # A declared length over the limit never reaches the application.
    seen.clear()
    sent.clear()
    declared = {"type": "http", "headers": [(b"content-length", b"101")]}
    await BodyLimit(app, 100)(declared, receive, send)
    assert seen == [] and sent[0]["status"] == 413
