"""daphne's command line as ``python -m gateway.serve`` builds it."""

from __future__ import annotations

import pytest

from gateway.serve import daphne_args


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
