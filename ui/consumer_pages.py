"""Consumer pages: list, create/edit, pause/resume, close circuit, secret, test event."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
