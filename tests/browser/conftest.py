"""The browser tests' fixture: a headless Chromium per test (tests.support.browsers)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.browsers import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    """Debian's Chromium, launched headless by Playwright and closed after the test."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        launched = await pw.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        yield launched
        await launched.close()
