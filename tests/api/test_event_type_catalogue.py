"""The event type catalogue (broker/event_catalogue.py, issue 19): a description and an optional
JSON Schema per type of a channel, managed over the API, and JSON payloads of a type with a
schema checked at publish (broadcast, batch, publish(), periodic messages). The limits on what a
schema may be (issue 36, broker/schema_checks.py) are here too; the attacks they stop are in
tests/reliability/test_hostile_schemas.py."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from django.test import Client

from broker import publish
from broker.models import EventType, Message
from broker.publishing import InvalidMessage
from broker.schema_checks import MAX_SCHEMA_DEPTH, MAX_SCHEMA_MEMBERS
from tests.conftest import FORM
from tests.helpers import BROADCAST_HEADERS

pytestmark = pytest.mark.django_db

URL = "/channel/orders/event-type"
ORDER_SCHEMA = {
    "type": "object",
    "required": ["order", "items"],
    "properties": {
        "order": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "object", "required": ["sku"]}},
    },
}


def put(client, name, headers=None, **fields):
    return client.put(f"{URL}/{name}", urlencode(fields), content_type=FORM, headers=headers or {})


def with_schema(client, name="order.created", schema=ORDER_SCHEMA):
    response = put(client, name, description="An order was placed.", schema=json.dumps(schema))
    assert response.status_code == 200, response.content
    return response


def test_an_entry_is_created_read_changed_listed_and_deleted(admin_client, channel):
    created = with_schema(admin_client)
    assert created.json()["Name"] == "order.created"
    assert created.json()["Schema"] == ORDER_SCHEMA
    assert created.json()["Description"] == "An order was placed."

    read = admin_client.get(f"{URL}/order.created")
    assert read.json() == created.json()
    assert admin_client.get("/channel/orders/event-types").json()["Result"] == [
        f"{URL}/order.created"
    ]

    unconditional = put(admin_client, "order.created", description="changed")
    assert unconditional.status_code == 400  # an update needs If-Unmodified-Since
    changed = put(
        admin_client,
        "order.created",
        {"If-Unmodified-Since": read["Last-Modified"]},
        schema="",
    )
    assert changed.status_code == 200
    assert changed.json()["Schema"] is None
    assert changed.json()["Description"] == "An order was placed."  # omitted: kept

    deleted = admin_client.delete(
        f"{URL}/order.created", headers={"If-Unmodified-Since": changed["Last-Modified"]}
    )
    assert deleted.status_code == 204
    assert not EventType.objects.exists()


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": "no-such-type"}', "schema: $.type"),
        ('{"minimum": "three"}', "schema: $.minimum"),
    ],
)
def test_an_invalid_schema_is_a_400_naming_the_problem(admin_client, channel, schema, error):
    response = put(admin_client, "order.created", schema=schema)

    assert response.status_code == 400
    assert error in response.content.decode()
    assert not EventType.objects.exists()


def test_a_bad_name_and_anonymous_callers_are_refused(admin_client, channel):
    assert put(admin_client, "has space", description="x").status_code == 400
    assert put(Client(), "order.created", description="x").status_code == 401
    assert admin_client.get(f"{URL}/unknown").status_code == 404
    assert admin_client.get("/channel/nope/event-types").status_code == 404


def broadcast(client, body, **headers):
    return client.post(
        "/channel/orders/broadcast",
        body,
        content_type=headers.pop("content_type", "application/json"),
        headers={**BROADCAST_HEADERS, "X-Broker-Event-Type": "order.created", **headers},
    )


def test_a_broadcast_must_match_its_types_schema(admin_client, client, channel):
    with_schema(admin_client)

    good = broadcast(client, json.dumps({"order": 1, "items": [{"sku": "A"}]}))
    missing = broadcast(client, json.dumps({"order": 1}))
    wrong = broadcast(client, json.dumps({"order": 1, "items": [{"qty": 2}]}))
    not_json = broadcast(client, b"{oops")

    assert good.status_code == 201
    assert missing.status_code == 400
    assert "'items' is a required property" in missing.json()["Error"]
    assert wrong.status_code == 400
    assert "$.items[0]" in wrong.json()["Error"]
    assert "'sku' is a required property" in wrong.json()["Error"]
    assert not_json.status_code == 400
    assert "not JSON" in not_json.json()["Error"]
    assert Message.objects.count() == 1


def test_what_the_schema_does_not_cover_is_not_checked(admin_client, client, channel):
    with_schema(admin_client)

    other_type = broadcast(client, b'{"x": 1}', **{"X-Broker-Event-Type": "order.paid"})
    not_json_content = broadcast(client, b"anything", content_type="text/plain")
    untyped = client.post(
        "/channel/orders/broadcast",
        b'{"x": 1}',
        content_type="application/json",
        headers=BROADCAST_HEADERS,
    )

    assert [r.status_code for r in (other_type, not_json_content, untyped)] == [201, 201, 201]


def test_publish_checks_and_a_changed_schema_applies_at_once(admin_client, channel):
    first = with_schema(admin_client)
    with pytest.raises(InvalidMessage, match="does not match the schema") as refused:
        publish(channel, {"order": "one"}, producer="shop", event_type="order.created")
    assert refused.value.field == "payload"

    put(
        admin_client,
        "order.created",
        {"If-Unmodified-Since": first["Last-Modified"]},
        schema=json.dumps({"type": "object"}),
    )
    publish(channel, {"order": "one"}, producer="shop", event_type="order.created")
    assert Message.objects.count() == 1


def test_a_batch_names_the_message_that_does_not_match(admin_client, client, channel):
    with_schema(admin_client)
    items = [
        {"payload": json.dumps({"order": 1, "items": []}), "content_type": "application/json",
         "event_type": "order.created"},
        {"payload": json.dumps({"order": "x", "items": []}), "content_type": "application/json",
         "event_type": "order.created"},
    ]  # fmt: skip

    response = client.post(
        "/channel/orders/broadcast-batch",
        json.dumps({"messages": items}),
        content_type="application/json",
        headers=BROADCAST_HEADERS,
    )

    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert (error["index"], error["field"]) == (1, "payload")
    assert "$.order" in error["message"]
    assert not Message.objects.exists()


def test_a_periodic_message_is_checked_when_saved(admin_client, channel):
    with_schema(admin_client)
    form = {"producer": "shop", "intervalSeconds": "60", "contentType": "application/json"}

    refused = admin_client.put(
        "/channel/orders/periodic-message/ping",
        urlencode({**form, "payload": '{"order": 1}', "eventType": "order.created"}),
        content_type=FORM,
    )

    assert refused.status_code == 400
    assert "'items' is a required property" in refused.json()["Error"]


def nested_schema(levels):
    schema: dict[str, object] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"not": schema}
    return schema


@pytest.mark.parametrize(
    ("schema", "error"),
    [
        (nested_schema(MAX_SCHEMA_DEPTH + 1), f"nested deeper than {MAX_SCHEMA_DEPTH} levels"),
        ("[" * 30_000 + "]" * 30_000, f"schema: nested deeper than {MAX_SCHEMA_DEPTH} levels"),
        (
            {"properties": {"a": {f"x-{n}": n for n in range(MAX_SCHEMA_MEMBERS + 1)}}},
            f"$.properties.a: 101 members; a schema object has at most {MAX_SCHEMA_MEMBERS}",
        ),
        (
            {"items": {"$schema": "http://json-schema.org/draft-07/schema#"}},
            "schema: $.items: `$schema` is taken only at the top",
        ),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "schema: $.$schema:"),
        ({"$schema": "https://example.com/my-dialect"}, "not a draft checked here"),
    ],
    ids=["deep", "deeper-than-the-parser", "members", "nested-dialect", "draft-3", "unknown"],
)
def test_a_schema_beyond_the_limits_is_400_naming_the_limit(admin_client, channel, schema, error):
    text = schema if isinstance(schema, str) else json.dumps(schema)

    response = put(admin_client, "order.created", schema=text)

    assert response.status_code == 400
    assert error in response.json()["Error"]
    assert not EventType.objects.exists()


def test_what_schemas_do_within_the_limits_still_works(admin_client, client, channel):
    """References inside the schema (by pointer, anchor, `$id`, dynamic), patterns, a draft
    named in `$schema`, unevaluatedProperties with patternProperties: as before the limits."""
    tree = {
        "$id": "https://example.com/tree",
        "$dynamicAnchor": "node",
        "type": "object",
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z]+\\d*$"},
            "children": {"type": "array", "items": {"$dynamicRef": "#node"}},
            "kind": {"$ref": "#/$defs/kind"},
        },
        "patternProperties": {"^x-": {"type": "string"}},
        "unevaluatedProperties": False,
        "$defs": {"kind": {"$anchor": "kind", "enum": ["leaf", "branch"]}},
    }
    with_schema(admin_client, schema=tree)
    draft7 = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "definitions": {"id": {"type": "string", "pattern": "^[0-9a-f]{4}$"}},
        "properties": {"id": {"$ref": "#/definitions/id"}},
        "additionalProperties": False,
    }
    with_schema(admin_client, name="order.old", schema=draft7)
    good_tree = {"name": "a1", "x-note": "n", "children": [{"name": "b", "kind": "leaf"}]}

    def old(payload):
        return broadcast(client, json.dumps(payload), **{"X-Broker-Event-Type": "order.old"})

    assert broadcast(client, json.dumps(good_tree)).status_code == 201
    extra = broadcast(client, json.dumps({**good_tree, "colour": "red"}))
    assert extra.status_code == 400
    assert "'colour' was unexpected" in extra.json()["Error"]
    bad_child = broadcast(client, json.dumps({"name": "a", "children": [{"name": "B"}]}))
    assert "$.children[0].name" in bad_child.json()["Error"]
    assert old({"id": "0a1f"}).status_code == 201
    assert old({"id": "0a1g"}).status_code == 400
    assert old({"id": "0a1f", "more": 1}).status_code == 400
