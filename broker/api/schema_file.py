"""docs/openapi.json: the API's OpenAPI schema, committed so that clients can be generated from
it without a running broker (clients/typescript does), and kept equal to what the code generates
by tests/api/test_openapi_file.py.

The served schema (`/api/schema/`) follows the running broker's settings (an operation opened by
BROKER_PUBLIC_STATUS or BROKER_PUBLIC_METRICS shows no security requirement); the file is made
with every broker setting at its default, whatever the environment says, so that it is the same
on every machine. It names no server and no date: the same code gives the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.test import override_settings
from drf_spectacular.drainage import GENERATOR_STATS, reset_generator_stats
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

from broker.settings_catalog import BrokerSettings

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
REGENERATE_COMMAND = "python manage.py openapi_file"


@dataclass(frozen=True)
class GeneratedSchema:
    schema: dict[str, Any]
    problems: list[str]  # drf-spectacular's warnings and errors, one line each

    @property
    def text(self) -> str:
        """The file's text: two-space indents, sorted keys, a final newline."""
        return json.dumps(self.schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate_schema() -> GeneratedSchema:
    """The schema as the code describes it, with the default broker settings."""
    reset_generator_stats()  # its caches are process-wide: only this generation's problems
    defaults = BrokerSettings.from_environment({}).values()
    with GENERATOR_STATS.silence(), override_settings(**defaults):
        generator = SchemaGenerator()  # type: ignore[no-untyped-call]
        schema = generator.get_schema(request=None, public=True)  # type: ignore[no-untyped-call]
    problems = [*GENERATOR_STATS._warn_cache, *GENERATOR_STATS._error_cache]
    reset_generator_stats()
    validate_schema(schema)  # type: ignore[no-untyped-call]  # raises unless valid OpenAPI 3
    return GeneratedSchema(schema, problems)
