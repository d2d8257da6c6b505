from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from broker.models import Message


class Command(BaseCommand):
    help = (
        "Delete offloaded payload files that no message names (left by rolled-back publishes), "
        "once they are older than --older-than-hours."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than-hours",
            type=float,
            default=24.0,
            help="only files written this long ago (default 24): keep it above your longest "
            "transaction that publishes",
        )

    def handle(self, *args: Any, older_than_hours: float, **options: Any) -> None:
        deleted = Message.purge_orphan_payloads(timedelta(hours=older_than_hours))
        self.stdout.write(f"Deleted {deleted} orphan payload file(s).")
