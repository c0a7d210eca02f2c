"""gateway.redact: what a log line keeps of a secret (issue 22.3)."""

from __future__ import annotations

import logging

from gateway.access.tokens import signed_token
from gateway.server.redact import redact, redact_record

STORED = "lc_aeGI_myjqdQRM_o573WnK7UtbMQvpyitzrg-qYaGqN4"


def test_query_parameters_bearer_headers_and_token_shapes_are_redacted() -> None:
    signed = signed_token("u", ["subscribe:t"], ttl=60, key="k" * 40)
    assert redact(f"GET /ws/t/?token={STORED}&x=1") == "GET /ws/t/?token=[redacted]&x=1"
    assert redact(f'"WebSocket /ws/?TOKEN={signed}" 403') == '"WebSocket /ws/?TOKEN=[redacted]" 403'
    assert redact(f"Authorization: Bearer {signed}") == "Authorization: Bearer [redacted]"
    assert redact(f"refused {STORED} here") == "refused [redacted] here"
    assert signed not in redact(f"claims {signed}.")


def test_text_without_secrets_is_unchanged() -> None:
    for text in ("GET /api/queues/lc_msg_ready_prio", "token 'ops' has no scope", "a=1&b=2"):
        assert redact(text) == text


def test_a_records_arguments_keep_their_types() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s" %d',
        ("127.0.0.1", "GET", f"/x?token={STORED}", 200),
        None,
    )
    redact_record(record)
    assert record.args == ("127.0.0.1", "GET", "/x?token=[redacted]", 200)
    assert record.getMessage() == '127.0.0.1 - "GET /x?token=[redacted]" 200'
