"""Leasecast's broker: the Django project and its engine.

Importing this package imports nothing from Django, so ``gateway.client``,
``gateway.protocol`` and ``gateway.errors`` work in plain Python programs.
"""
