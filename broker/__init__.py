"""Webhook broker: durable HTTP pub/sub with at-least-once push and pull delivery.

`from broker import publish` gives the transactional-outbox entry point (docs/outbox.md). It is
loaded lazily because this package is also the Django project, imported before the app registry is
ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "publish"]

if TYPE_CHECKING:
    from broker.publishing import publish


def __getattr__(name: str) -> Any:
    if name == "publish":
        from broker.publishing import publish

        return publish
    raise AttributeError(f"module 'broker' has no attribute {name!r}")
