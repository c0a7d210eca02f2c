"""``python -m spark_feed``: the example streaming job (spark_feed.job)."""

from __future__ import annotations

import sys

from spark_feed.job import main

sys.exit(main())
