"""Scheduled and periodic messages: list, create, cancel, enable/disable."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
