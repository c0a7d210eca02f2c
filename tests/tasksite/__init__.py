"""A small Django project whose tasks the task worker's tests run.

``settings`` is the gateway's own settings plus ``TASKS`` on
``gateway.tasks.LeasecastBackend``, with this package an installed app (so
``tasks``, which holds the tasks, is the workers' registry); ``driver``
enqueues them and reads their results from another process. ``unimportable``
and ``side_effect`` hold tasks the workers must refuse without importing.
"""
