"""An order of the example shop."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total_cents = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} of {self.customer}"
