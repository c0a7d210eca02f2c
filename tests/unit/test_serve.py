"""daphne's and uvicorn's command lines as ``python -m gateway.serve`` builds them."""

from __future__ import annotations

import pytest

from gateway.serve import daphne_args, shutdown_grace, split_server, uvicorn_args


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
