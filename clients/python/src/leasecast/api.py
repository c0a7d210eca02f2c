"""The gateway's HTTP API from Python: :func:`http_get`.

A plain ``urllib`` call, no extra dependency: what the ``leasecast stats``
command and the Django task worker (which reads a queue's
``max_deliveries``) use to read the API's JSON documents
(docs/protocol.md, HTTP API). Imports nothing from Django.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from leasecast.errors import LeasecastError, error_for_code
from leasecast.link import http_url

__all__ = ["http_call", "http_get"]


def http_get(base: str, path: str, token: str, timeout: float = 30.0) -> Any:
    """``GET`` a JSON document from the gateway's HTTP API with the bearer token.

    Args:
        base: the gateway, ``http://host:port`` (``ws://`` works too).
        path: e.g. ``/api/stats``.
        token: the API token.
        timeout: seconds to wait for the gateway.

    Returns:
        The decoded JSON.

    Raises:
        ProtocolError: the gateway answered with an error status (its ``error`` code).
        LeasecastError: the gateway could not be reached or did not answer JSON.
    """
    url = http_url(base, path)
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    return http_call(request, timeout)


def http_call(request: urllib.request.Request, timeout: float) -> Any:
    """Send ``request`` to the gateway's HTTP API; its decoded JSON answer.

    Raises:
        ProtocolError: the gateway answered with an error status (its ``error`` code).
        LeasecastError: the gateway could not be reached or did not answer JSON.
    """
    url = request.full_url
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as err:
        raise _http_error(err) from err
    except urllib.error.URLError as err:
        raise LeasecastError(f"cannot reach {url}: {err.reason}") from err
    except OSError as err:  # a timeout or reset while reading the answer
        raise LeasecastError(f"cannot reach {url}: {err}") from err
    try:
        return json.loads(raw)
    except ValueError as err:
        raise LeasecastError(f"{url} did not answer JSON") from err


def _http_error(err: urllib.error.HTTPError) -> LeasecastError:
    # The API answers {"error": CODE, "detail": ...}; a proxy in between may not.
    try:
        body = json.loads(err.read())
    except (ValueError, OSError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return error_for_code(body["error"], str(body.get("detail") or ""))
    return LeasecastError(f"HTTP {err.code} {err.reason}")
