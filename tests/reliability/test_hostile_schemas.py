"""Event type schemas and payloads from a hostile tenant (issue 36, item 3): checking a payload
against its type's schema cannot hurt the broker (broker/schema_checks.py, schema_budget.py,
schema_keywords.py, schema_validation.py; docs/api.md, "Event type catalogue").

Each of the first tests is an attack found on the code before: a schema that made the web worker
fetch a URL, a pattern that backtracked for minutes, a `uniqueItems` that compared every pair,
references that were saved and then failed every publish. Work is measured in this thread's CPU
time, with bounds generous for a loaded machine (each attack took 15 s or more before).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest

from broker import publish, publish_many
from broker.models import EventType, Message
from broker.publishing import InvalidMessage, PayloadTooLarge
from broker.publishing_batch import BatchMessage, BatchTooLarge
from broker.schema_budget import MAX_PAYLOAD_DEPTH, MAX_VALIDATION_DEPTH, MAX_VALIDATION_STEPS
from tests.conftest import ADMIN_TOKEN, FORM
from tests.db_snapshot import snapshot
from tests.helpers import BROADCAST_HEADERS, make_channel, make_producer

pytestmark = pytest.mark.django_db

TYPES = "/channel/orders/event-type"
CPU_SECONDS = 2.0  # what an attack may cost here; each took 15 s or more (or forever) before


def put_schema(client, schema, name="attack"):
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return client.put(f"{TYPES}/{name}", urlencode({"schema": text}), content_type=FORM)


def saved(client, schema, name="attack"):
    response = put_schema(client, schema, name)
    assert response.status_code == 200, response.content
    return response


def broadcast(client, payload, name="attack"):
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return client.post(
        "/channel/orders/broadcast",
        body,
        content_type="application/json",
        headers={**BROADCAST_HEADERS, "X-Broker-Event-Type": name},
    )


class Cpu:
    """This thread's CPU time across a block (the test client runs the request in it)."""

    def __enter__(self) -> Cpu:
        self.started = time.thread_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.thread_time() - self.started


def nested_arrays(depth):
    text = "[" * depth + "]" * depth
    return text.encode()


# --- the attacks found before the fix ---------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        lambda url: {"$ref": url},
        lambda url: {"$id": url, "properties": {"a": {"$ref": "other.json"}}},
        lambda url: {"$defs": {"a": {"$dynamicRef": url + "#meta"}}, "$ref": "#/$defs/a"},
        lambda url: {"not": {"$ref": "https://json-schema.org/draft/2020-12/schema"}},
    ],
    ids=["absolute", "relative-to-id", "dynamic", "a-metaschema"],
)
def test_a_reference_outside_the_schema_is_refused_when_saved_and_nothing_is_fetched(
    admin_client, channel, receiver, schema
):
    before = snapshot()
    response = put_schema(admin_client, schema(receiver.url("/s.json")))

    assert response.status_code == 400
    assert (
        "does not resolve inside the schema (nothing is ever fetched)" in response.json()["Error"]
    )
    assert snapshot() == before
    assert receiver.received == []


def test_a_schema_with_a_url_saved_before_the_checks_refuses_publishes_without_fetching(
    client, channel, receiver
):
    EventType.objects.create(channel=channel, name="attack", schema={"$ref": receiver.url()})

    with Cpu() as cpu:
        refused = [broadcast(client, {"n": n}) for n in range(3)]

    assert [response.status_code for response in refused] == [400] * 3
    error = refused[0].json()["Error"]
    assert "schema saved before the checks it now fails" in error
    assert "an admin must change it" in error
    assert receiver.received == []
    assert not Message.objects.exists()
    assert cpu.seconds < CPU_SECONDS


def test_a_backtracking_pattern_runs_in_linear_time(admin_client, client, channel):
    saved(admin_client, {"pattern": "^(a+)+$"})

    with Cpu() as cpu:
        refused = [broadcast(client, "a" * 34 + "!") for _ in range(3)]
        much_longer = broadcast(client, "a" * 1_000_000 + "!")
        matching = broadcast(client, "a" * 34)

    assert [response.status_code for response in refused] == [400] * 3
    assert "does not match '^(a+)+$'" in refused[0].json()["Error"]
    assert much_longer.status_code == 400
    assert matching.status_code == 201
    assert cpu.seconds < CPU_SECONDS


@pytest.mark.parametrize(
    ("schema", "place"),
    [
        ({"pattern": "(a)\\1"}, "$.pattern"),
        ({"properties": {"id": {"pattern": "^(?=x)"}}}, "$.properties.id.pattern"),
        ({"patternProperties": {"(?<!a)b": {}}}, "$.patternProperties"),
        ({"items": {"pattern": "\ud800"}}, "$.items.pattern"),
    ],
    ids=["backreference", "lookahead", "lookbehind-key", "lone-surrogate"],
)
def test_a_pattern_the_linear_time_engine_cannot_run_is_refused_naming_it(
    admin_client, channel, schema, place
):
    response = put_schema(admin_client, schema)

    assert response.status_code == 400
    # A lone surrogate is refused by the reading of the JSON itself (broker/storable_text.py).
    assert response.json()["Error"].startswith(f"schema: {place}")
    assert not EventType.objects.exists()


def test_unique_items_is_checked_in_n_log_n(admin_client, client, channel, settings):
    settings.BROKER_SCHEMA_STEPS_PER_SECOND = 0  # each publish's own bound is the subject here
    saved(admin_client, {"type": "array", "uniqueItems": True})
    distinct = [{"id": n, "tags": ["a", n]} for n in range(16_000)]

    with Cpu() as cpu:
        accepted = broadcast(client, distinct)
        repeated = broadcast(client, [*distinct[:4000], {"tags": ["a", 3.0], "id": 3}])

    assert accepted.status_code == 201
    assert repeated.status_code == 400
    assert "has non-unique elements (item 4000 repeats an earlier one)" in repeated.json()["Error"]
    assert cpu.seconds < CPU_SECONDS


def test_json_equality_holds_for_unique_items_enum_and_const(admin_client, client, channel):
    saved(admin_client, {"uniqueItems": True, "items": {"enum": [1, {"a": [True]}]}})

    assert broadcast(client, [1, {"a": [True]}]).status_code == 201
    assert broadcast(client, [1.0, {"a": [True]}]).status_code == 201  # 1.0 is 1
    assert broadcast(client, [1, 1.0]).status_code == 400  # the same twice
    assert broadcast(client, [True]).status_code == 400  # true is not 1
    assert broadcast(client, [{"a": [1]}]).status_code == 400
    saved(admin_client, {"const": {"x": 1, "y": [0.0]}}, name="exact")
    assert broadcast(client, {"y": [0], "x": 1.0}, name="exact").status_code == 201
    assert broadcast(client, {"y": [False], "x": 1}, name="exact").status_code == 400


def test_a_schema_leading_back_to_itself_in_place_is_refused_when_saved(admin_client, channel):
    loop = {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"not": {"$ref": "#/$defs/a"}}}
    for schema, where, back_to in [
        ({"$ref": "#"}, "$.$ref: '#'", "$"),
        ({"anyOf": [{"type": "string"}, {"$ref": "#"}]}, "$.anyOf[1].$ref: '#'", "$"),
        ({"$defs": loop, "$ref": "#/$defs/a"}, "$.$defs.b.not.$ref: '#/$defs/a'", "$.$defs.a"),
    ]:
        response = put_schema(admin_client, schema)
        assert response.status_code == 400
        assert response.json()["Error"] == (
            f"schema: {where} leads back to {back_to} without going into the payload:"
            " checking a payload against it would never end."
        )
    assert not EventType.objects.exists()
    # Recursion that goes into the payload is fine: each step is a level deeper in it.
    saved(admin_client, {"type": "array", "items": {"$ref": "#"}})
    saved(
        admin_client,
        {
            "$ref": "#/$defs/a",
            "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"type": "integer"}},
        },
        name="chain",
    )


def test_a_chain_of_references_too_long_is_refused_at_publish_within_bounds(
    admin_client, client, channel
):
    # 2 schemas deep per link (allOf, then $ref): 100 links go beyond the depth limit.
    links = {f"a{n}": {"allOf": [{"$ref": f"#/$defs/a{n + 1}"}]} for n in range(99)}
    saved(admin_client, {"$ref": "#/$defs/a0", "$defs": {**links, "a99": {}}})
    saved(
        admin_client,
        {"anyOf": [{"$ref": "#/$defs/a0"}], "$defs": {**links, "a99": {}}},
        name="loop",
    )

    with Cpu() as cpu:
        answers = [broadcast(client, {"a": 1}), broadcast(client, [1], name="loop")]

    assert [answer.status_code for answer in answers] == [413, 413]
    for answer in answers:
        assert f"more than {MAX_VALIDATION_DEPTH} schemas deep" in answer.json()["Error"]
    assert not Message.objects.exists()
    assert cpu.seconds < CPU_SECONDS


def test_a_reference_to_nowhere_or_to_no_schema_is_refused_when_saved(admin_client, channel):
    for schema, where in [
        ({"$ref": "#/$defs/nope"}, "$.$ref: '#/$defs/nope'"),
        ({"items": {"$ref": "#no-anchor"}}, "$.items.$ref: '#no-anchor'"),
        ({"$defs": {"x": {"$ref": "#/$defs/y"}}, "$ref": "#/$defs/x"}, "$.$defs.x.$ref"),
        (  # a string where a schema should be: a 500 at every publish before
            {"items": {"$ref": "#/properties/a/type"}, "properties": {"a": {"type": "string"}}},
            "$.items.$ref: '#/properties/a/type' leads to something that is not a schema",
        ),
    ]:
        response = put_schema(admin_client, schema)
        assert response.status_code == 400
        assert response.json()["Error"].startswith(f"schema: {where}")
    assert not EventType.objects.exists()


def test_a_payload_deeper_than_the_limit_is_413_naming_it(admin_client, client, channel):
    saved(admin_client, {"type": "array", "items": {"$ref": "#"}})

    with Cpu() as cpu:
        deep = broadcast(client, nested_arrays(900))
        deeper_than_the_parser = broadcast(client, nested_arrays(100_000))
        at_the_limit = broadcast(client, nested_arrays(MAX_PAYLOAD_DEPTH))

    for answer in (deep, deeper_than_the_parser):
        assert answer.status_code == 413
        assert f"nested deeper than {MAX_PAYLOAD_DEPTH} levels" in answer.json()["Error"]
    assert at_the_limit.status_code == 201
    assert cpu.seconds < CPU_SECONDS


# --- the bounds on work -------------------------------------------------------------------------


def exponential_schema(levels=40):
    """Each level tries the next one twice: 2**40 paths, each a few bytes of schema."""
    defs: dict[str, Any] = {
        f"l{n}": {"anyOf": [{"$ref": f"#/$defs/l{n + 1}"}, {"$ref": f"#/$defs/l{n + 1}"}]}
        for n in range(levels)
    }
    defs[f"l{levels}"] = {"type": "string"}
    return {"$ref": "#/$defs/l0", "$defs": defs}


def dynamic_scope_schema(resources=55, levels=30):
    """The exponential schema at the end of a chain of resources: each `$dynamicRef` at its
    leaves looks for its anchor in every resource of the chain."""
    defs: dict[str, Any] = {
        f"r{n}": {"$id": f"urn:r{n}", "$ref": f"urn:r{n + 1}"} for n in range(resources)
    }
    inner = exponential_schema(levels)["$defs"]
    inner[f"l{levels}"] = {"$dynamicRef": "#leaf"}
    inner["leaf"] = {"$dynamicAnchor": "leaf", "type": "string"}
    defs[f"r{resources}"] = {"$id": f"urn:r{resources}", "$ref": "#/$defs/l0", "$defs": inner}
    return {"$ref": "urn:r0", "$defs": defs}


@pytest.mark.parametrize(
    ("schema", "payload"),
    [
        (exponential_schema(), 1),
        (dynamic_scope_schema(), 1),
        ({"allOf": [{"type": "string"}] * 200}, [{"a": "x" * 10}] * 100_000),  # errors repeat it
        (
            {"patternProperties": {f"^a{n}(b|c)*d$": {} for n in range(100)}},
            {f"a{n}" + "b" * 30: n for n in range(50_000)},
        ),
    ],
    ids=["exponential", "dynamic-scope", "error-messages", "patterns"],
)
def test_validation_work_beyond_the_budget_is_413_naming_it(
    admin_client, client, channel, schema, payload
):
    saved(admin_client, schema)

    with Cpu() as cpu:
        refused = broadcast(client, payload)

    assert refused.status_code == 413
    assert f"takes more than {MAX_VALIDATION_STEPS} steps" in refused.json()["Error"]
    assert cpu.seconds < CPU_SECONDS


def test_a_costly_schema_still_takes_what_it_can_check(admin_client, client, channel):
    saved(admin_client, exponential_schema())

    assert broadcast(client, "a string").status_code == 201  # the first path holds at once


def test_a_batch_shares_one_budget_and_is_checked_on_the_same_path(
    admin_client, client, channel, settings
):
    settings.BROKER_SCHEMA_STEPS_PER_SECOND = 0  # three budgets' worth: beyond the allowance
    saved(admin_client, {"type": "array", "items": {"type": "integer"}}, name="numbers")
    saved(admin_client, exponential_schema(), name="exponential")
    saved(admin_client, {"pattern": "^(a+)+$"}, name="pattern")
    large = json.dumps(list(range(MAX_VALIDATION_STEPS // 8)))  # most of the budget alone
    before = snapshot()

    def post(*items):
        messages = [
            {"payload": payload, "content_type": "application/json", "event_type": name}
            for name, payload in items
        ]
        return client.post(
            "/channel/orders/broadcast-batch",
            json.dumps({"messages": messages}),
            content_type="application/json",
            headers=BROADCAST_HEADERS,
        )

    with Cpu() as cpu:
        alone = post(("numbers", large))
        together = post(("numbers", large), ("numbers", large), ("pattern", '"aa"'))
        costly = post(("pattern", json.dumps("a" * 34 + "!")), ("exponential", "1"))

    assert alone.status_code == 201
    assert together.status_code == 413
    errors = together.json()["errors"]
    # The second message spent what was left; the third finds nothing left.
    assert [(error["index"], error["field"]) for error in errors] == [
        (1, "payload"),
        (2, "payload"),
    ]
    assert all(f"more than {MAX_VALIDATION_STEPS} steps" in error["message"] for error in errors)
    assert costly.status_code == 413
    assert [error["index"] for error in costly.json()["errors"]] == [0, 1]
    assert "does not match" in costly.json()["errors"][0]["message"]
    assert Message.objects.count() == 1  # the one accepted batch
    assert cpu.seconds < 2 * CPU_SECONDS
    Message.objects.all().delete()
    assert snapshot() == before


def test_publish_and_publish_many_are_bounded_alike(admin_client, channel):
    saved(admin_client, exponential_schema())

    def publish_json(payload):
        return publish(
            channel, payload, producer="shop", content_type="application/json", event_type="attack"
        )

    with pytest.raises(PayloadTooLarge, match="steps") as refused:
        publish_json("1")
    assert refused.value.field == "payload"
    message = BatchMessage("1", content_type="application/json", event_type="attack")
    with pytest.raises(BatchTooLarge) as batch:
        publish_many(channel, [message] * 3, producer="shop")
    assert [error.index for error in batch.value.errors] == [0, 1, 2]
    with pytest.raises(InvalidMessage, match="not JSON"):
        publish_json("{")
    publish_json('"a string"')
    assert Message.objects.count() == 1


def test_a_periodic_message_too_costly_to_check_is_refused_when_saved(admin_client, channel):
    saved(admin_client, {"type": "array", "items": {"$ref": "#"}})
    form = {"producer": "shop", "intervalSeconds": "60", "contentType": "application/json"}

    refused = admin_client.put(
        "/channel/orders/periodic-message/ping",
        urlencode({**form, "payload": nested_arrays(40).decode(), "eventType": "attack"}),
        content_type=FORM,
    )

    assert refused.status_code == 400
    assert f"nested deeper than {MAX_PAYLOAD_DEPTH} levels" in refused.json()["Error"]


def test_multiple_of_a_fraction_takes_a_huge_integer(admin_client, client, channel):
    saved(admin_client, {"multipleOf": 0.5})

    assert broadcast(client, b"1" + b"0" * 400).status_code == 201  # was an OverflowError: 500
    assert broadcast(client, b"1" + b"0" * 400 + b".25").status_code == 400  # read as infinity
    assert broadcast(client, 0.25).status_code == 400
    assert broadcast(client, 4.5).status_code == 201


# --- under the production server ----------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_gunicorn_answers_every_attack_quickly_and_its_worker_keeps_serving(receiver):
    """Before: each of these requests held gunicorn's only worker until it was killed (30 s),
    answering an HTML 500, or for ever. Now each is a JSON 4xx or 201 within seconds."""
    from tests.api_server import running_api

    make_channel()
    make_producer()
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": FORM}
    # Each request's own bounds are the subject here: the producer's allowance is off.
    with running_api(BROKER_ADMIN_TOKENS=ADMIN_TOKEN, BROKER_SCHEMA_STEPS_PER_SECOND="0") as server:

        def save(name, schema):
            body = urlencode({"schema": json.dumps(schema)}).encode()
            return server.request("PUT", f"{TYPES}/{name}", body, admin).status

        def send(name, body):
            headers = {**BROADCAST_HEADERS, "X-Broker-Event-Type": name}
            headers["Content-Type"] = "application/json"
            started = time.monotonic()
            answer = server.request("POST", "/channel/orders/broadcast", body, headers)
            return answer, time.monotonic() - started

        assert save("fetch", {"$ref": receiver.url("/s.json")}) == 400
        assert save("backtrack", {"pattern": "^(a+)+$"}) == 200
        assert save("unique", {"type": "array", "uniqueItems": True}) == 200
        assert save("itself", {"$ref": "#"}) == 400
        assert save("recursive", {"type": "array", "items": {"$ref": "#"}}) == 200
        unique = json.dumps([{"n": n} for n in range(16_000)]).encode()
        attacks = [
            ("backtrack", json.dumps("a" * 34 + "!").encode(), 400),
            ("backtrack", json.dumps("a" * 34 + "!").encode(), 400),
            ("backtrack", json.dumps("a" * 34 + "!").encode(), 400),
            ("unique", unique, 201),
            ("recursive", nested_arrays(900), 413),
        ]
        for name, body, expected in attacks:
            answer, seconds = send(name, body)
            assert answer.status == expected, (name, answer.body[:300])
            assert expected == 201 or "Error" in json.loads(answer.body), name
            assert seconds < 10, (name, seconds)  # gunicorn killed the worker at 30 s before
        assert server.request("GET", "/_status").status == 200
        assert "WORKER TIMEOUT" not in server.output()
    assert receiver.received == []
