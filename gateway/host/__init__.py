"""The Django-facing API, for the host project's own code: ``gateway.enqueue``
(``producer``), the django.tasks backend and its worker, store transactions on
Django's connection, and the operator's actions (the admin and the HTTP API).
"""
