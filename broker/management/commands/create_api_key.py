from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from broker.models import ApiKey


class Command(BaseCommand):
    help = "Create an admin API key; it is printed once and stored only as a hash."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="what the key is for, e.g. 'deploy-bot'")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        try:
            _, key = ApiKey.issue(name)
        except IntegrityError:
            raise CommandError(f"An API key named {name!r} exists; revoke it first.") from None
        self.stdout.write(key)
