"""A channel's event type catalogue (docs/api.md, "Event type catalogue"): a description per type
and, optionally, a JSON Schema that the JSON payloads of that type must match at publish.

Schemas are checked against their own metaschema when saved (Draft 2020-12 unless they name
another with `$schema`), and never fetch anything: a `$ref` to another document is an error at
validation, not a request. A payload is checked only when its content type is JSON
(`application/json`, or any `+json` type) and its type has a schema; the refusal names the
first failing place (a JSON path) and the rule it breaks. Compiled validators are kept per
process, keyed by the entry's `changed_at`, so a changed schema applies to the next publish in
every process.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from jsonschema import exceptions, validators

from broker.event_types import InvalidEventType, checked_event_type
from broker.models import Channel, EventType
from broker.storable_text import UnstorableText, read_json

MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION_LENGTH = 2000


class InvalidCatalogueEntry(ValueError):
    """A description or schema the catalogue cannot take; str() says why."""


class PayloadRefused(ValueError):
    """A JSON payload that does not match its type's schema; str() names where and why."""


def checked_schema(text: str) -> dict[str, Any] | None:
    """The schema of a form field's JSON text (blank: none); InvalidCatalogueEntry if it is not
    JSON, not an object, too large, or not a valid schema of its draft."""
    if not text.strip():
        return None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidCatalogueEntry(f"schema: at most {MAX_SCHEMA_BYTES} bytes.")
    try:
        schema = read_json(text, root="$")
    except ValueError:
        raise InvalidCatalogueEntry("schema: not JSON.") from None
    except UnstorableText as error:  # stored as jsonb, which holds neither
        raise InvalidCatalogueEntry(f"schema: {error}") from None
    if not isinstance(schema, dict):
        raise InvalidCatalogueEntry("schema: a JSON Schema is a JSON object.")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as error:
        raise InvalidCatalogueEntry(f"schema: {_where(error)}: {error.message}") from None
    return schema


def checked_name(name: str) -> str:
    try:
        return checked_event_type(name)
    except InvalidEventType as error:
        raise InvalidCatalogueEntry(str(error)) from None


def save_entry(
    channel: Channel, name: str, fields: dict[str, Any], precondition: Any = None
) -> EventType:
    """Create or change the channel's entry for `name` from validated `fields` (`description`,
    `schema`; an omitted one keeps its value). `precondition(entry)` runs on an existing entry
    before it changes (the API's If-Unmodified-Since)."""
    with transaction.atomic():
        entry = EventType.objects.select_for_update().filter(channel=channel, name=name).first()
        if entry is None:
            entry = EventType(channel=channel, name=name)
        elif precondition is not None:
            precondition(entry)
        for field in ("description", "schema"):
            if field in fields:
                setattr(entry, field, fields[field])
        entry.save()
    return entry


def is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


class Schemas:
    """The schemas of one channel's event types, each read at most once (a batch of a thousand
    messages of one type reads it once)."""

    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        self._entries: dict[str, tuple[int, str, dict[str, Any]] | None] = {}

    def check(self, event_type: str | None, body: bytes, content_type: str) -> None:
        """PayloadRefused when `event_type` has a schema and the JSON payload does not match
        it. One indexed read per new type of a JSON payload; none otherwise."""
        if event_type is None or not is_json(content_type):
            return
        entry = self._entry(event_type)
        if entry is None:
            return
        try:
            document = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise PayloadRefused(
                f"The payload is not JSON, and event type {event_type!r} has a schema."
            ) from None
        errors = sorted(_validator(*entry).iter_errors(document), key=_order)
        if errors:
            first = errors[0]
            raise PayloadRefused(
                f"The payload does not match the schema of event type {event_type!r}:"
                f" {_where(first)}: {first.message[:300]}"
            )

    def _entry(self, event_type: str) -> tuple[int, str, dict[str, Any]] | None:
        if event_type not in self._entries:
            row = (
                EventType.objects.filter(
                    channel_id=self.channel_id, name=event_type, schema__isnull=False
                )
                .values_list("pk", "changed_at", "schema")
                .first()
            )
            self._entries[event_type] = (row[0], row[1].isoformat(), row[2] or {}) if row else None
        return self._entries[event_type]


_VALIDATORS: dict[tuple[int, str], Any] = {}
MAX_VALIDATORS = 256


def _validator(pk: int, changed_at: str, schema: dict[str, Any]) -> Any:
    """The compiled validator of an entry's version, built once per process."""
    key = (pk, changed_at)
    validator = _VALIDATORS.get(key)
    if validator is None:
        if len(_VALIDATORS) >= MAX_VALIDATORS:
            _VALIDATORS.clear()
        validator = _VALIDATORS[key] = validators.validator_for(schema)(schema)
    return validator


def _order(error: exceptions.ValidationError) -> list[str]:
    return [str(part) for part in error.absolute_path]


def _where(error: exceptions.ValidationError | exceptions.SchemaError) -> str:
    return error.json_path
