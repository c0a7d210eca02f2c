"""A small Django project whose tasks the task worker's tests run.

``settings`` is the gateway's own settings plus ``TASKS`` on
``gateway.tasks.LeasecastBackend``; ``tasks`` holds the tasks; ``driver``
enqueues them and reads their results from another process.
"""
