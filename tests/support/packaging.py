"""Whether pip can fetch packages on this machine (the install tests skip, saying why, if not)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from urllib.parse import urlsplit


def index_unreachable() -> str | None:
    """Why pip could not fetch packages here, or None if it probably can."""
    config = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    if "find-links" in config or "file://" in config:
        return None  # a local wheelhouse or index: no network needed
    host = urlsplit(os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple")).hostname
    try:
        socket.create_connection((host or "pypi.org", 443), timeout=5).close()
    except OSError as exc:
        return f"no package index reachable ({host}: {exc}): cannot install websockets and orjson"
    return None
