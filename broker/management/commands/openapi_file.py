from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from broker.api.schema_file import SCHEMA_FILE, generate_schema


class Command(BaseCommand):
    help = (
        "Write the OpenAPI schema to docs/openapi.json (with --check: only say whether it is up "
        "to date). Refuses while schema generation has warnings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--check", action="store_true", help="exit 1 when docs/openapi.json differs"
        )

    def handle(self, *args: Any, check: bool, **options: Any) -> None:
        generated = generate_schema()
        if generated.problems:
            raise CommandError("Schema generation warned:\n" + "\n".join(generated.problems))
        if check:
            if SCHEMA_FILE.read_text() != generated.text:
                raise CommandError(f"{SCHEMA_FILE} is out of date: run manage.py openapi_file.")
            self.stdout.write(f"{SCHEMA_FILE} is up to date.")
            return
        SCHEMA_FILE.write_text(generated.text)
        self.stdout.write(f"Wrote {SCHEMA_FILE}.")
