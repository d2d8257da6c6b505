"""Message search by ID, its jobs and attempts, and replay to one or all consumers."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
