from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from shop.models import Order


class Command(BaseCommand):
    help = 'Place an order: save it and publish "order.created" in one transaction.'

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("customer")
        parser.add_argument("total", type=Decimal)
        parser.add_argument(
            "--decline-payment",
            action="store_true",
            help="fail after publishing, as a declined payment would: everything rolls back",
        )

    def handle(
        self, *args: Any, customer: str, total: Decimal, decline_payment: bool, **options: Any
    ) -> None:
        with transaction.atomic():
            order = Order.place(customer, total)
            if decline_payment:
                # Raised inside the transaction: the order and its message are rolled back
                # together, and the consumers never hear of this order.
                raise CommandError(f"Payment for {order} declined; nothing was kept.")
        self.stdout.write(f"{order} placed; order.created:{order.pk} published")
