"""Tokens never reach a log line (docs/operations.md, Security).

A client may send its token as ``?token=`` (browsers cannot set a
WebSocket's headers), so every access log would otherwise keep it: uvicorn's
(HTTP and WebSocket, refused sockets too) and daphne's (HTTP). A log is read
by more people, kept longer and copied further than the token store.

:func:`redact` replaces what looks like a secret in a text: the value of a
``token=`` parameter, what follows ``Bearer``, a stored token (``lc_`` and
43 URL-safe characters) and a JWT (a signed token), wherever they appear.
``python -m gateway.serve`` applies it to every log record the process makes
(:func:`install_log_redaction`) and to daphne's access log, which is written
to its stream without the ``logging`` module
(:func:`redacting_access_log`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["REDACTED", "install_log_redaction", "redact", "redacting_access_log"]

#: What a secret is replaced with.
REDACTED = "[redacted]"

_SECRETS = re.compile(
    r"(?P<param>(?i:token)=)[^&\s\"'#;,]+"
    r"|(?P<bearer>(?i:bearer)\s+)[^\s\"',;]+"
    r"|\blc_[A-Za-z0-9_-]{20,}"
    r"|\beyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"
)
#: Cheap pre-check: a text holding none of these holds no secret.
_HINTS = ("oken=", "earer", "lc_", "eyJ")


def redact(text: str) -> str:
    """``text`` with every token-like secret in it replaced by ``[redacted]``."""
    if not any(hint in text for hint in _HINTS):
        return text
    return _SECRETS.sub(_replacement, text)


def _replacement(match: re.Match[str]) -> str:
    prefix = match.group("param") or match.group("bearer") or ""
    return prefix + REDACTED


def _redact_value(value: Any) -> Any:
    # Only strings and bytes are rewritten: other arguments keep their type,
    # so "%d" and the formatters that unpack args (uvicorn's) still work.
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, bytes):
        text = value.decode("latin-1")
        redacted = redact(text)
        return value if redacted == text else redacted.encode("latin-1")
    return value


def redact_record(record: logging.LogRecord) -> None:
    """Redact a log record's message and arguments in place."""
    if isinstance(record.msg, str):
        record.msg = redact(record.msg)
    args = record.args
    if isinstance(args, tuple):
        record.args = tuple(_redact_value(arg) for arg in args)
    elif isinstance(args, dict):
        record.args = {key: _redact_value(value) for key, value in args.items()}


_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process makes from now on, whatever its logger.

    A record factory rather than a filter: filters apply only to the logger
    or handler they are attached to, and the servers and Django configure
    their own handlers after this runs.
    """
    global _installed
    if _installed:
        return
    _installed = True
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        redact_record(record)
        return record

    logging.setLogRecordFactory(factory)


def redacting_access_log(base: type[Any]) -> type[Any]:
    """A subclass of daphne's ``AccessLogGenerator`` that redacts each entry's request line."""

    class RedactingAccessLog(base):  # type: ignore[misc]
        """daphne's access log, without tokens."""

        def write_entry(
            self, host: Any, date: Any, request: str, *args: Any, **kwargs: Any
        ) -> None:
            super().write_entry(host, date, redact(request), *args, **kwargs)

    return RedactingAccessLog
