"""The shop's orders in its admin (Leasecast's queues, messages and tokens are there too)."""

from __future__ import annotations

from django.contrib import admin

from orders.models import Order

admin.site.register(Order)
