"""The dashboard's pure reading of /api/stats sockets (dashboard.live)."""

from __future__ import annotations

from typing import Any

from dashboard.live import alerts, subscriptions_of


def sub(topic: str, rate: float, drop_rate: float, **more: Any) -> dict[str, Any]:
    return {"topic": topic, "policy": "drop_oldest", "rate": rate, "drop_rate": drop_rate, **more}


def test_a_multiplexed_socket_counts_as_its_subscriptions() -> None:
    mux = {
        "kind": "multiplex",
        "id": "s7",
        "client": "10.0.0.9",
        "subscriptions": 3,
        "topics": [sub("prices", 90, 10), sub("news", 100, 0), {"topic": "x", "state": "starting"}],
    }
    carried = subscriptions_of(mux)
    assert [(s["id"], s["topic"], s["client"]) for s in carried] == [
        ("s7:prices", "prices", "10.0.0.9"),
        ("s7:news", "news", "10.0.0.9"),
    ]
    assert subscriptions_of({"kind": "worker", "id": "w"}) == []
    plain = {"kind": "subscriber", "id": "s1", **sub("news", 50, 50)}
    assert subscriptions_of(plain) == [plain]
    stream = {"kind": "sse", "id": "e2", **sub("news", 1, 0)}
    assert subscriptions_of(stream) == [stream]
    # A /ws/ subscription dropping 10% raises the same alert a subscriber socket would.
    found = alerts([{"name": "gw1", "sockets": [mux, plain]}], [], 60.0)
    assert [(a["consumer"], a["topic"]) for a in found] == [
        ("gw1/s1", "news"),
        ("gw1/s7:prices", "prices"),
    ]
