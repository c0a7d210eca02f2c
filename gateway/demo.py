"""The public path of the demo command, ``python -m gateway.demo``: ``gateway.demo``.

The code is in :mod:`gateway.site.demo`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.site.demo import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
