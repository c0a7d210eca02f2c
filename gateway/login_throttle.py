"""The public path of the throttled login backend: ``gateway.login_throttle``.

The code is in :mod:`gateway.access.login_throttle`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.access.login_throttle import ThrottledModelBackend

__all__ = ["ThrottledModelBackend"]
