"""The public path of the CORS middleware: ``gateway.cors``.

The code is in :mod:`gateway.server.cors`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.server.cors import CrossOrigin

__all__ = ["CrossOrigin"]
