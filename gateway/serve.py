"""The public path of the server command, ``python -m gateway.serve``: ``gateway.serve``.

The code is in :mod:`gateway.server.serve`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.server.serve import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
