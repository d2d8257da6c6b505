from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker.seed import SeedError, apply_seed, parse_seed


class Command(BaseCommand):
    help = (
        "Load channels, producers and consumers from a webhook-broker INI seed file. Prints a "
        "line per resource, and the tokens it generated for those the file gives none, once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path)

    def handle(self, *args: Any, file: Path, **options: Any) -> None:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"Cannot read {file}: {exc}") from None
        try:
            seed = parse_seed(text)
        except SeedError as exc:
            raise CommandError(f"{file}: {exc}; nothing was loaded.") from None
        for line in apply_seed(seed):
            self.stdout.write(line)
