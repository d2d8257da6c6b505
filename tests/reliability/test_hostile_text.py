"""Text the broker cannot store (issue 36 §4): a lone surrogate or a NUL in any field or key of a
JSON body, or in any form value, is refused with a 400 naming the field and changes nothing;
never a 500 (broker/storable_text.py, broker/utf8_requests.py).

First the report's 500s, a lone surrogate in a batch item's payload or key and in a pull report's
`Error` or `ID`, as plain tests. Then two properties: hypothesis puts generated unstorable text
(tests/reliability/hostile.py) in any value or key of a valid request to every endpoint that reads
JSON, written as JSON escapes or as raw UTF-8 bytes; and in any field of every API form, as
percent-encoded UTF-8 or under a declared charset (`unicode_escape`) that would decode it back, in
fields holding JSON as escapes. The operator UI's forms: tests/ui/test_fuzz_text.py. Last, the
admin's JSON fields.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django import forms
from django.contrib import admin
from django.test import RequestFactory
from hypothesis import given
from hypothesis import strategies as st

from broker import publish
from broker.models import Message, PeriodicMessage
from broker.storable_text import StorableJSONField
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue import take_for_pull
from tests.conftest import ADMIN_TOKEN, FORM
from tests.db_snapshot import fingerprint
from tests.faults import report_counts
from tests.helpers import (
    BROADCAST_HEADERS,
    make_consumer,
    make_consumer_with_token,
    make_operator,
    tokens,
)
from tests.reliability.hostile import PROPERTY, form_encoded, unstorable_text

# PostgreSQL: "changed nothing" is a digest of every table, taken in SQL (tests/db_snapshot.py).
pytestmark = pytest.mark.django_db

WORKER = "/channel/orders/consumer/worker"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
JOB = "{job}"  # stands for the worker's job's ID in a path or a body
MESSAGE_IDS = itertools.count()
OUTCOMES: Counter[str] = Counter()

# A valid request to every endpoint that reads a JSON body: (path, headers, body).
JSON_REQUESTS: dict[str, tuple[str, dict[str, str], dict[str, Any]]] = {
    "broadcast-batch": (
        "/channel/orders/broadcast-batch",
        BROADCAST_HEADERS,
        {
            "messages": [
                {
                    "id": "new",
                    "payload": "x",
                    "content_type": "text/plain",
                    "headers": {"X-Tenant": "a"},
                    "ordering_key": "k",
                    "event_type": "order.created",
                }
            ]
        },
    ),
    "report": (f"{WORKER}/report", tokens(), {"Jobs": [{"ID": JOB, "NextState": "DEAD"}]}),
    "transition": (f"{WORKER}/job/{JOB}", tokens(), {"NextState": "DELIVERED"}),
    "claim": (f"{WORKER}/claim", tokens(), {"limit": 1, "timeout": 30}),
    "replay": ("/channel/orders/message/m-1/replay", ADMIN, {"consumer": "billing"}),
}
# A valid request to every API endpoint that reads a form: (method, path, fields).
FORM_REQUESTS: dict[str, tuple[str, str, dict[str, str]]] = {
    "producer": ("put", "/producer/p-new", {"name": "P", "token": "producer-2"}),
    "channel": ("put", "/channel/c-new", {"name": "C", "token": "channel-2"}),
    "consumer": (
        "put",
        "/channel/orders/consumer/k-new",
        {
            "name": "K",
            "token": "consumer-2",
            "callbackUrl": "http://127.0.0.1:9/hook",
            "type": "push",
            "ordering": "none",
            "retryDelays": "1, 2",
            "nonRetryableStatuses": "410",
            "maxInFlight": "3",
            "maxJobAge": "60",
            "maxPerSecond": "1",
            "eventTypes": "order.*",
        },
    ),
    "event type": (
        "put",
        "/channel/orders/event-type/order.new",
        {"description": "d", "schema": '{"description": "d"}'},
    ),
    "periodic": (
        "post",
        "/channel/orders/periodic-messages",
        {
            "producer": "shop",
            "payload": "x",
            "contentType": "text/plain",
            "headers": '{"X-Tenant": "a"}',
            "orderingKey": "k",
            "eventType": "order.created",
            "intervalSeconds": "60",
            "timeZone": "UTC",
        },
    ),
    "dlq": ("post", f"{WORKER}/dlq", {"requeue": "consumer-token", "since": "2020-01-01T00:00Z"}),
    "claim": ("post", f"{WORKER}/claim", {"limit": "1", "timeout": "30"}),
    "replay": ("post", "/channel/orders/message/m-1/replay", {"consumer": "billing"}),
}
JSON_VALUED = {"schema": "description", "headers": "X-Tenant"}  # form fields holding JSON


@pytest.fixture(scope="module", autouse=True)
def report_outcomes():
    yield
    report_counts("hostile text: answers to generated unstorable text", OUTCOMES)


@pytest.fixture
def job(client, channel, settings) -> Job:
    """The worker's job of message m-1, in flight; billing, a push consumer, has one too."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    worker = make_consumer_with_token(channel)
    make_consumer(channel)
    job = Job.objects.get(
        message=publish(channel, b"x", producer="shop", message_id="m-1"), consumer=worker
    )
    take_for_pull(job)
    return job


def send_json(client, name: str, job: Job, body: dict[str, Any] | bytes):
    path, headers, _ = JSON_REQUESTS[name]
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    path = path.replace(JOB, job.public_id)
    return client.post(path, body, content_type="application/json", headers=headers)


def with_job(document: Any, job: Job) -> Any:
    return json.loads(json.dumps(document).replace(JOB, job.public_id))


# --- the report's 500s -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "body", "named"),
    [
        ("broadcast-batch", {"messages": [{"payload": "\ud800"}]}, "messages[0].payload"),
        ("broadcast-batch", {"messages": [{"payload": "x", "\ud800": "y"}]}, "messages[0]["),
        (
            "broadcast-batch",
            {"messages": [{"payload": "x", "ordering_key": "\ud800"}]},
            "messages[0].ordering_key",
        ),
        ("report", {"Jobs": [{"ID": "\ud800", "NextState": "DEAD"}]}, "Jobs[0].ID"),
        (
            "report",
            {"Jobs": [{"ID": JOB, "NextState": "DEAD", "Error": "\ud800"}]},
            "Jobs[0].Error",
        ),
        (
            "report",
            {"Jobs": [{"ID": JOB, "NextState": "DEAD", "Error": "a\x00b"}]},
            "Jobs[0].Error",
        ),
    ],
)
def test_a_lone_surrogate_or_nul_is_a_400_naming_the_field(client, job, name, body, named):
    before = fingerprint()

    response = send_json(client, name, job, with_job(body, job))

    assert response.status_code == 400, response.content
    assert response.json()["Error"].startswith(named), response.json()
    assert fingerprint() == before


def test_a_nul_in_a_batch_payload_is_kept_as_the_bytes_it_is(client, job):
    """A text payload is stored as UTF-8 bytes, which may hold NUL: not refused."""
    response = send_json(
        client, "broadcast-batch", job, {"messages": [{"id": "nul", "payload": "a\x00b"}]}
    )

    assert response.status_code == 201, response.content
    assert bytes(Message.objects.get(public_id="nul").payload) == b"a\x00b"


# --- every JSON endpoint -----------------------------------------------------------------------


def places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Where in a JSON document hostile text can go: each value, and each object's keys."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield "name", (*path, key)
            yield from places(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from places(item, (*path, index))
    else:
        yield "value", path


def put(document: Any, place: tuple[str, tuple[Any, ...]], text: str) -> Any:
    kind, path = place
    document = copy.deepcopy(document)
    parent = document
    for step in path[:-1]:
        parent = parent[step]
    if kind == "value":
        parent[path[-1]] = text
    else:  # the key renamed, in its place
        items = [(text if key == path[-1] else key, value) for key, value in parent.items()]
        parent.clear()
        parent.update(items)
    return document


def field_name(path: tuple[Any, ...]) -> str:
    """A field's name as the API's errors give it: messages[0].payload."""
    name = ""
    for step in path:
        name += f"[{step}]" if isinstance(step, int) else f".{step}" if name else step
    return name


JSON_PLACES = [
    (name, place) for name, (_, _, body) in JSON_REQUESTS.items() for place in places(body)
]


@PROPERTY
@given(where=st.sampled_from(JSON_PLACES), text=unstorable_text, raw=st.booleans())
def test_unstorable_text_anywhere_in_a_json_body_is_refused_naming_it(
    client, job, where, text, raw
):
    name, place = where
    _, _, body = JSON_REQUESTS[name]
    body = with_job(body, job)
    if name == "broadcast-batch":
        body["messages"][0]["id"] = f"new-{next(MESSAGE_IDS)}"
    document = put(body, place, text)
    # Raw: the surrogate written as its (invalid) UTF-8 bytes; NUL is always an escape in JSON.
    sent = json.dumps(document, ensure_ascii=not raw).encode("utf-8", "surrogatepass")
    before = fingerprint()

    response = send_json(client, name, job, sent)

    OUTCOMES[f"JSON {response.status_code}"] += 1
    nul_only = all(
        character == "\x00" or not 0xD800 <= ord(character) <= 0xDFFF for character in text
    )
    if place == ("value", ("messages", 0, "payload")) and nul_only:
        assert response.status_code == 201, response.content  # bytes may hold NUL
        return
    assert response.status_code == 400, (name, place, response.content)
    error = response.json()["Error"]
    kind, path = place
    if kind == "value":
        assert error.startswith(f"{field_name(path)} holds "), error
    else:
        assert error.startswith(field_name(path[:-1])), error
        assert " has a name that holds " in error, error
    assert fingerprint() == before


# --- every API form ----------------------------------------------------------------------------


FORM_PLACES = [(name, field) for name, (_, _, fields) in FORM_REQUESTS.items() for field in fields]


@PROPERTY
@given(
    where=st.sampled_from(FORM_PLACES),
    text=unstorable_text,
    charset=st.sampled_from(["utf-8", "unicode_escape"]),
)
def test_unstorable_text_in_any_form_field_is_never_stored(client, job, where, text, charset):
    """Read as UTF-8 whatever the charset, a form value cannot hold a lone surrogate; a NUL is
    refused by the field, naming it; JSON in a field is read as a JSON body is."""
    name, field = where
    method, path, fields = FORM_REQUESTS[name]
    value = json.dumps({JSON_VALUED[field]: text}) if field in JSON_VALUED else text
    before = fingerprint()

    response = getattr(client, method)(
        path,
        form_encoded({**fields, field: value}, charset),
        content_type=f"{FORM}; charset={charset}",
        headers={**ADMIN, **tokens()},
    )

    OUTCOMES[f"form {response.status_code}"] += 1
    assert response.status_code < 500, (name, field, response.content)
    if response.status_code >= 400:
        assert fingerprint() == before, (name, field, response.status_code)
    if charset != "utf-8":
        return  # read as UTF-8 all the same: text such as `\\ud800`, JSON escapes doubled
    if field in JSON_VALUED:
        assert response.status_code == 400, (name, field, response.content)
        assert f"$.{JSON_VALUED[field]} holds " in response.json()["Error"]
    elif "\x00" in text:  # (a surrogate arrives as U+FFFD, which may be stored)
        assert response.status_code == 400, (name, field, response.content)
        assert field in response.json()["Error"], response.json()


# --- the admin ---------------------------------------------------------------------------------


@pytest.fixture
def admin_request(db):
    request = RequestFactory().get("/admin/")
    request.user = make_operator()
    request.user.is_superuser = True
    return request


def test_every_json_field_of_the_admin_refuses_unstorable_text(admin_request):
    checked = 0
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in ("broker", "consumers", "jobs"):
            continue  # Django's and django-q2's own
        if not model_admin.has_change_permission(admin_request):
            continue  # every field shown read-only (broker.admin.ReadOnlyAdmin)
        for name, field in model_admin.get_form(admin_request).base_fields.items():
            if isinstance(field, forms.JSONField):
                assert isinstance(field, StorableJSONField), (model.__name__, name)
                checked += 1
    # The periodic message's headers, the schema (the consumer's settings are text, checked by
    # the API's parsers: below).
    assert checked >= 2


def test_the_admin_names_the_place_of_a_lone_surrogate(admin_request):
    """Saved, `["\\ud800"]` was a 500: jsonb refuses the escape."""
    form_class = admin.site._registry[PeriodicMessage].get_form(admin_request)

    form = form_class(data={"headers": '{"X-Note": [1, "\\ud800"]}'})

    assert not form.is_valid()
    assert "$.X-Note[1] holds a lone surrogate (U+D800)" in str(form.errors["headers"])


def test_the_admin_refuses_unstorable_consumer_settings_as_the_api_does(job, admin_request):
    consumer = Consumer.objects.get(public_id="billing")
    form_class = admin.site._registry[Consumer].get_form(admin_request, consumer)

    form = form_class(
        data={"retry_delays": "1, \ud800", "event_types": "order.\ud800"}, instance=consumer
    )

    assert not form.is_valid()
    assert form.errors["retry_delays"] == ["retryDelays: comma-separated integers."]
    assert str(form.errors["event_types"][0]).startswith("eventTypes: ")
