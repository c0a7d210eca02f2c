"""The task benchmark's site (``bench/tasks.py``): one no-op task for each system.

``settings`` is the gateway's own settings plus ``TASKS`` on
``gateway.tasks.LeasecastBackend`` or, with ``BENCH_TASK_BACKEND=db``,
``django_tasks_db.DatabaseBackend``; ``jobs`` holds the ``django.tasks`` no-op
task; ``celery_app`` the same task for Celery; ``producer`` enqueues tasks
and reads their results, in a process of its own.
"""
