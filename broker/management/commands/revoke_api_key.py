from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker.models import ApiKey


class Command(BaseCommand):
    help = "Revoke (delete) an admin API key by name."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        deleted, _ = ApiKey.objects.filter(name=name).delete()
        if not deleted:
            raise CommandError(f"No API key named {name!r}.")
        self.stdout.write(f"Revoked {name}.")
