from __future__ import annotations

from django.apps import AppConfig


class ConsumersConfig(AppConfig):
    name = "consumers"
