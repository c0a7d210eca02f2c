"""A task module the test workers cannot import (``TASKSITE_WORKER`` is set for them).

Its tasks can be enqueued by the driver, as a task whose code is deployed to
the web servers but not (yet) to the workers.
"""

from __future__ import annotations

import os

from tests.tasksite.tasks import task

if os.environ.get("TASKSITE_WORKER"):
    raise ImportError("tests.tasksite.unimportable is not installed on this worker")


@task()
def lost() -> int:
    return 1
