"""The dashboard page (staff only; everyone else is sent to log in)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


@staff_member_required
@ensure_csrf_cookie  # the page's purge and redrive buttons POST with it
def index(request: HttpRequest) -> HttpResponse:
    """The live page; its data comes over ``/ws/dashboard/``."""
    return render(request, "dashboard/index.html")
