"""Debian's Chromium for the browser tests, driven by Playwright (never `playwright install`).

The ``browser`` fixture (``tests/browser/conftest.py``) launches it with
:data:`CHROMIUM_ARGS`; a module skips, saying why, when :func:`browser_missing`
says it cannot run here.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "PASSWORD", "STAFF", "browser_missing"]

CHROMIUM = os.environ.get("LEASECAST_CHROMIUM", "/usr/bin/chromium")
#: No sandbox (root in CI), no GPU, nothing fetched in the background.
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
)
#: The staff user the browser tests' gateways are made with, and its password.
STAFF, PASSWORD = "ops", "correct horse battery"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here (no Chromium, no Playwright), or None."""
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (make test installs Debian's chromium when run as root)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed"
    return None
