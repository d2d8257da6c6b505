from __future__ import annotations

from django.apps import AppConfig


class BrokerConfig(AppConfig):
    name = "broker"
    verbose_name = "Broker"

    def ready(self) -> None:
        from broker import checks  # noqa: F401  (registers the system checks)
        from broker.api import schema  # noqa: F401  (registers OpenAPI extensions)
