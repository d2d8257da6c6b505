"""Nothing but `/_status` answers a caller without credentials (docs/api.md; docs/reliability.md;
issue 9).

The operations come from the OpenAPI schema the broker serves, so an endpoint added later is
covered without editing this file. Every operation is called with existing IDs (so a refusal
cannot hide behind a 404), without any credential, and with the session of a logged-in user who
is not staff or is staff without the permission broker.administer_broker; each must be refused
with the JSON error and change nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from broker import publish
from jobs.models import Job
from tests.conftest import FORM
from tests.db_snapshot import snapshot
from tests.helpers import make_channel, make_consumer, make_consumer_with_token, make_producer

pytestmark = pytest.mark.django_db

PUBLIC = {("GET", "/_status")}  # BROKER_PUBLIC_STATUS, true by default: load balancer probes
# As webhook-broker: a DLQ requeue whose `requeue` form field is not the consumer's token is 400.
REFUSED_WITH = {("POST", "/channel/{channel_id}/consumer/{consumer_id}/dlq"): 400}
BODIES = {"PUT": "name=x&callbackUrl=http%3A%2F%2F127.0.0.1%3A9%2Fx", "POST": "requeue=&limit=1"}


def operations() -> list[tuple[str, str]]:
    schema = json.loads(Client().get("/api/schema/", {"format": "json"}).content)
    return sorted(
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "put", "post", "delete", "patch"}
    )


@pytest.fixture
def rows():
    channel = make_channel()
    make_producer()
    make_consumer(channel, "billing")
    make_consumer_with_token(channel, "worker")
    publish(channel, b"x", producer="shop", message_id="m-1")
    job = Job.objects.get(consumer__public_id="worker")
    return {
        "channel_id": "orders",
        "resource_id": "orders",
        "consumer_id": "worker",
        "message_id": "m-1",
        "job_id": str(job.pk),
        "periodic_id": "1",
    }


def fill(path: str, values: dict[str, str]) -> str:
    if path.startswith("/producer/"):
        values = {**values, "resource_id": "shop"}
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    return path


def each_guarded_operation(client, rows) -> Iterator[tuple[str, str, str, Any]]:
    """Every operation of the schema but the public ones, called by `client` on `rows`:
    (method, path template, path, response). None of them may change a row."""
    for method, template in operations():
        if (method, template) in PUBLIC:
            continue
        path = fill(template, rows)
        before = snapshot()
        response = client.generic(method, path, BODIES.get(method, ""), content_type=FORM)
        assert snapshot() == before, (method, path)
        yield method, template, path, response


def test_the_schema_lists_the_operations():
    found = operations()
    assert len(found) >= 40
    assert ("POST", "/channel/{channel_id}/broadcast") in found
    assert ("GET", "/channel/{channel_id}/consumer/{consumer_id}/secret") in found


@pytest.mark.django_db(transaction=True)
def test_every_operation_refuses_anonymous_callers_and_changes_nothing(rows):
    refused = []
    for method, template, path, response in each_guarded_operation(Client(), rows):
        body = json.loads(response.content)
        expected = REFUSED_WITH.get((method, template), 401)
        assert response.status_code == expected, (method, path, response.status_code, body)
        assert set(body) == {"Error"}
        refused.append(path)
    assert len(refused) >= 40


@pytest.mark.parametrize("is_staff", [False, True], ids=["not staff", "staff without permission"])
def test_a_logged_in_user_who_is_not_an_admin_is_refused(client, rows, is_staff):
    user = User.objects.create_user("someone", password="pw", is_staff=is_staff)
    client.force_login(user)
    for method, template, path, response in each_guarded_operation(client, rows):
        # Admin endpoints: 403 (authenticated, not allowed); token endpoints: 401 (no token).
        expected = {REFUSED_WITH.get((method, template), 401), 403}
        assert response.status_code in expected, (method, path, response.status_code)


def test_status_is_public_by_default_and_can_be_closed(client, settings, rows):
    assert client.get("/_status").status_code == 200
    settings.BROKER_PUBLIC_STATUS = False
    assert client.get("/_status").status_code == 401
