"""The public path of signed connection tokens: ``gateway.tokens``.

The code is in :mod:`gateway.access.tokens`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.access.tokens import signed_token, verify_signed_token

__all__ = ["signed_token", "verify_signed_token"]
