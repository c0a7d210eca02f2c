"""The public path of log redaction: ``gateway.redact``.

The code is in :mod:`gateway.server.redact`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.server.redact import install_log_redaction, redacting_access_log

__all__ = ["install_log_redaction", "redacting_access_log"]
