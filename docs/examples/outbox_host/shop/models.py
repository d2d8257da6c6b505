"""The shop's one model: an order, which other services learn about through the broker."""

from __future__ import annotations

from decimal import Decimal

from django.db import models, transaction

from broker import publish

# Created by `manage.py load_seed broker-seed.cfg`.
CHANNEL, PRODUCER = "orders", "shop"


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.customer})"

    @classmethod
    def place(cls, customer: str, total: Decimal) -> Order:
        """Save an order and publish "order.created" in one transaction: both or neither.

        Called inside the caller's own `transaction.atomic()`, both join that transaction and
        are kept only if it commits.
        """
        with transaction.atomic():
            order = cls(customer=customer, total=total)
            order.save()
            order.announce("order.created")
        return order

    def announce(self, event: str) -> None:
        # The message ID is derived from the order, so the same event can never be stored twice:
        # a second `announce` of it raises broker.publishing.DuplicateMessage.
        publish(
            CHANNEL,
            {"event": event, "order": self.pk, "customer": self.customer, "total": str(self.total)},
            producer=PRODUCER,
            message_id=f"{event}:{self.pk}",
            headers={"X-Event-Type": event},
        )
