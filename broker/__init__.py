"""Webhook broker: durable HTTP pub/sub with at-least-once push and pull delivery.

`from broker import publish` (and `publish_many`, for a batch) gives the transactional-outbox
entry point (docs/outbox.md). It is loaded lazily because this package is also the Django
project, imported before the app registry is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "publish", "publish_many"]

if TYPE_CHECKING:
    from broker.publishing import publish
    from broker.publishing_batch import publish_many


def __getattr__(name: str) -> Any:
    if name == "publish":
        from broker.publishing import publish

        return publish
    if name == "publish_many":
        from broker.publishing_batch import publish_many

        return publish_many
    raise AttributeError(f"module 'broker' has no attribute {name!r}")
