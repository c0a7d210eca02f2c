"""gateway.server.autobahn_logs: autobahn's frame path stops colouring its debug arguments."""

from __future__ import annotations

import importlib

import pytest

from gateway.server import autobahn_logs


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the helpers back after the test (this process's autobahn is shared)."""
    for name in autobahn_logs.FRAME_MODULES:
        module = importlib.import_module(name)
        for helper in autobahn_logs.HELPERS:
            monkeypatch.setattr(module, helper, getattr(module, helper))


def test_both_frame_modules_get_plain_helpers(restored: None) -> None:
    # An autobahn that renamed or moved the helpers would leave the CPU spent:
    # this fails then, rather than the swap silently doing nothing.
    assert autobahn_logs.plain_debug_arguments() == list(autobahn_logs.FRAME_MODULES)
    protocol = importlib.import_module("autobahn.websocket.protocol")
    method = test_both_frame_modules_get_plain_helpers
    assert protocol.hltype(method) is method
    assert protocol.hlval(42, color="blue", bold=False) == 42
