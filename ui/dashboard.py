"""Dashboard: queue depth, rates, latency, circuits, heartbeats, charts (served at /ui/)."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
