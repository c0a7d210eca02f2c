"""A task module with an import side effect, never registered with the test workers.

When ``TASKSITE_IMPORTED`` names a file (the workers' environment and the unit
tests set it), importing this module appends ``imported PID`` to it: a worker
that imported the module a message names, rather than look the task up in its
registry, leaves that line behind. The driver can still enqueue ``touch``, as a
web process whose code has tasks the workers were not told about.
"""

from __future__ import annotations

import os

from tests.tasksite.tasks import task

_IMPORTED = os.environ.get("TASKSITE_IMPORTED")
if _IMPORTED:
    with open(_IMPORTED, "a") as f:
        f.write(f"imported {os.getpid()}\n")


@task()
def touch() -> str:
    return "touched"
