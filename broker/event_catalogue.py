"""A channel's event type catalogue (docs/api.md, "Event type catalogue"): a description per type
and, optionally, a JSON Schema that the JSON payloads of that type must match at publish.

A schema is checked when saved (broker/schema_checks.py): valid for its draft (Draft 2020-12
unless it names another with `$schema`), and one that checking payloads against cannot hurt: no
reference outside itself (nothing is ever fetched), patterns RE2 runs, bounded size and depth. A
payload is checked only when its content type is JSON (`application/json`, or any `+json` type)
and its type has a schema, within the publish's budget of steps (broker/schema_validation.py);
the refusal names the first failing place (a JSON path) and the rule it breaks, or the limit the
check would go beyond (PayloadTooCostly). Compiled schemas are kept per process, keyed by the
entry's `changed_at`, so a changed schema applies to the next publish in every process.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction

from broker.event_types import InvalidEventType, checked_event_type
from broker.models import Channel, EventType
from broker.schema_allowance import publish_budget
from broker.schema_budget import MAX_PAYLOAD_DEPTH, TooCostly
from broker.schema_checks import MAX_SCHEMA_DEPTH, SchemaRefused, checked
from broker.schema_validation import BoundedSchema
from broker.storable_text import UnstorableText, read_json

MAX_SCHEMA_BYTES = 64 * 1024
MAX_DESCRIPTION_LENGTH = 2000


class InvalidCatalogueEntry(ValueError):
    """A description or schema the catalogue cannot take; str() says why."""


class PayloadRefused(ValueError):
    """A JSON payload that does not match its type's schema; str() names where and why."""


class PayloadTooCostly(PayloadRefused):
    """A JSON payload whose check would go beyond a limit (broker/schema_budget.py): too deep,
    or more steps than the publish has left; str() names the limit."""


def checked_schema(text: str) -> dict[str, Any] | None:
    """The schema of a form field's JSON text (blank: none); InvalidCatalogueEntry if it is not
    JSON, not an object, too large, or breaks a rule of broker/schema_checks.py. The message
    leaves out the field's name: the API's error and the admin's form put it in front."""
    if not text.strip():
        return None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidCatalogueEntry(f"at most {MAX_SCHEMA_BYTES} bytes.")
    try:
        schema = read_json(text, root="$")
    except RecursionError:
        raise InvalidCatalogueEntry(f"nested deeper than {MAX_SCHEMA_DEPTH} levels.") from None
    except ValueError:
        raise InvalidCatalogueEntry("not JSON.") from None
    except UnstorableText as error:  # stored as jsonb, which holds neither
        raise InvalidCatalogueEntry(str(error)) from None
    if not isinstance(schema, dict):
        raise InvalidCatalogueEntry("a JSON Schema is a JSON object.")
    try:
        checked(schema)
    except SchemaRefused as error:
        raise InvalidCatalogueEntry(str(error)) from None
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
    """The schemas of one channel's event types for one publish, each read at most once (a
    batch of a thousand messages of one type reads it once), and the publish's budget of
    validation steps, which the messages of a batch share."""

    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        self.budget = publish_budget()
        self._entries: dict[str, tuple[int, str, dict[str, Any]] | None] = {}

    def check(self, event_type: str | None, body: bytes, content_type: str) -> None:
        """PayloadRefused when `event_type` has a schema and the JSON payload does not match
        it (PayloadTooCostly when checking it would go beyond a limit). One indexed read per new
        type of a JSON payload; none otherwise."""
        if event_type is None or not is_json(content_type):
            return
        entry = self._entry(event_type)
        if entry is None:
            return
        try:
            document = json.loads(body)
        except RecursionError:
            raise PayloadTooCostly(
                f"The payload of event type {event_type!r} cannot be checked against its schema:"
                f" it is nested deeper than {MAX_PAYLOAD_DEPTH} levels."
            ) from None
        except (ValueError, UnicodeDecodeError):
            raise PayloadRefused(
                f"The payload is not JSON, and event type {event_type!r} has a schema."
            ) from None
        try:
            first = _compiled(*entry).first_error(document, self.budget)
        except TooCostly as error:
            raise PayloadTooCostly(
                f"The payload of event type {event_type!r} cannot be checked against its schema:"
                f" {error}."
            ) from None
        except SchemaRefused as error:
            raise PayloadRefused(
                f"Event type {event_type!r} has a schema saved before the checks it now fails"
                f" ({error}); an admin must change it."
            ) from None
        if first is not None:
            raise PayloadRefused(
                f"The payload does not match the schema of event type {event_type!r}:"
                f" {first.json_path}: {first.message[:300]}"
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


_COMPILED: dict[tuple[int, str], BoundedSchema | str] = {}
MAX_COMPILED = 256


def _compiled(pk: int, changed_at: str, schema: dict[str, Any]) -> BoundedSchema:
    """The compiled schema of an entry's version, built once per process; SchemaRefused (also
    remembered) for a schema saved before the checks it fails."""
    key = (pk, changed_at)
    compiled = _COMPILED.get(key)
    if compiled is None:
        if len(_COMPILED) >= MAX_COMPILED:
            _COMPILED.clear()
        try:
            compiled = BoundedSchema(schema)
        except SchemaRefused as error:
            compiled = str(error)
        _COMPILED[key] = compiled
    if isinstance(compiled, str):
        raise SchemaRefused(compiled)
    return compiled
